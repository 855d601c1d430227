"""Pruning accepted rewrites (``prune_rewrites``): a sentence a winner added that costs more than it gives goes.

A rewrite is kept for its net gain on validation, but an LM's rewrite often adds several sentences at once: the
fix its cluster asked for, and beside it a rule of its own invention or a fix that also breaks other examples.
The net gain keeps the harmful sentence too, and later rewrites build on it, so it would stay for the rest of the
run. Where a validation pass that kept winners left examples worse than before it, each sentence the winners added
is left out in turn, first on those examples only; an absence that wins back more than every other is then judged
on a full pass.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

from ...program.program_state import ProgramState
from ..state import CandidateRecord
from .protocol import JudgingParts

#: Where an instruction is cut into sentences: after a full stop, question or exclamation mark, or at a line break.
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\s*\n\s*")
#: Most sentences of one predictor that are left out one by one: a rewrite that changed more did not add a few
#: separable rules, it rewrote the instruction, and leaving out each of its sentences would cost a run per sentence.
MAX_ADDED_SENTENCES = 6


def sentences(text: str) -> list[str]:
    """``text`` cut into sentences (or lines), each stripped; empty pieces dropped."""
    return [piece.strip() for piece in _SENTENCE_END.split(text) if piece.strip()]


def added_sentences(previous: str, current: str) -> list[str]:
    """The sentences of ``current`` that ``previous`` does not have, in order, each once."""
    before = set(sentences(previous))
    return list(dict.fromkeys(s for s in sentences(current) if s not in before))


def without_sentence(text: str, sentence: str) -> str:
    """``text`` with the last occurrence of ``sentence`` cut out, and the spaces around the cut joined into one."""
    at = text.rfind(sentence)
    if at < 0:
        return text
    head, tail = text[:at].rstrip(" \t"), text[at + len(sentence) :].lstrip(" \t")
    return f"{head} {tail}".strip() if head and tail and not head.endswith("\n") else (head + tail).strip()


@dataclass
class RewritePruning:
    """Leaves out a sentence that a validation pass's winners added when the program does better without it.

    ``install`` makes a program the current one (the judge's own). Nothing is paid when the pass left no validation
    example worse than before it; otherwise the leave-one-out programs run on those examples only, and the one that
    wins back most, if it wins back more than any other, is judged on a full pass by
    :meth:`~.acceptance.Acceptance.validate` (a removal is kept on the terms a rewrite is: ``val_acceptance``).
    Repeated while a sentence can go.
    """

    parts: JudgingParts
    install: Callable[[ProgramState], None]

    def prune(self, winners: list[CandidateRecord], before: list[float], judged: list[CandidateRecord]) -> None:
        """After ``winners`` were kept over a program that scored ``before`` on validation: leave out their harmful
        sentences. Each removal judged on a full pass (kept or not) goes into ``judged`` once it has its verdict, for
        the caller to record (the one being judged when the run stops is the verdict writer's unfinished one)."""
        acceptance, verdicts, budget = self.parts.acceptance, self.parts.verdicts, self.parts.budget
        tried: set[tuple[str, str]] = set()
        while True:
            trials = self._trials(winners, tried)
            if not trials:
                return
            gains = acceptance.win_backs([program for _, program, _ in trials], before)
            at = self._to_blame(gains)
            if at is None:
                return
            suspect, program, sentence = trials[at]
            tried.add((suspect.predictor, sentence))
            verdicts.open(suspect)
            start, bar = budget.metric_calls, self.parts.state.best_val_total
            kept = acceptance.validate(suspect, program)
            suspect.metric_calls = budget.metric_calls - start
            if kept:
                how = "better" if self.parts.state.best_val_total > bar else "as good"  # a tie, with ties accepted
                verdicts.accept(suspect, f"{how} on validation without a sentence its rewrite added")
                self.install(program)
            verdicts.close()
            judged.append(suspect)
            if not kept:
                return

    @staticmethod
    def _to_blame(gains: list[Fraction] | None) -> int | None:
        """The trial whose absence wins back most on the examples made worse, if it wins back more than every other
        absence does: where leaving out any sentence repairs as much (a task LM that samples fails on other
        examples on every pass), no sentence is to blame."""
        if not gains:
            return None
        order = sorted(range(len(gains)), key=lambda i: gains[i], reverse=True)
        runner_up = gains[order[1]] if len(order) > 1 else Fraction(0)
        return order[0] if gains[order[0]] > max(runner_up, Fraction(0)) else None

    def _trials(
        self, winners: list[CandidateRecord], tried: set[tuple[str, str]]
    ) -> list[tuple[CandidateRecord, ProgramState, str]]:
        """Per sentence the winners added to a predictor (two or more, at most :data:`MAX_ADDED_SENTENCES`): a
        record of leaving it out, the current program without it, and the sentence."""
        program, trials = self.parts.state.instructions, []
        for name, first in self._first_winner(winners).items():
            current = program.instruction(name)
            added = added_sentences(first.previous_instruction, current)
            if not 2 <= len(added) <= MAX_ADDED_SENTENCES:
                continue
            for sentence in added:
                if (name, sentence) in tried:
                    continue
                pruned = without_sentence(current, sentence)
                record = CandidateRecord(
                    self.parts.state.round_index,
                    name,
                    first.cluster_size,
                    first.min_cluster_size,
                    f"leave out what a rewrite added: {sentence}",
                    current,
                    pruned,
                )
                trials.append((record, program.with_instruction(name, pruned), sentence))
        return trials

    @staticmethod
    def _first_winner(winners: list[CandidateRecord]) -> dict[str, CandidateRecord]:
        """Each predictor's first kept rewrite among ``winners``: the instruction it rewrote is where the pass
        started from."""
        first: dict[str, CandidateRecord] = {}
        for record in winners:
            if record.accepted and record.kind == "instructions" and record.instruction is not None:
                first.setdefault(record.predictor, record)
        return first
