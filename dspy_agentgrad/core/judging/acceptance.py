"""Step 5's judge: one object that decides a candidate's fate.

A candidate must beat the current program on its cluster, then on validation. This module
owns every part of that decision: what a check may cost before it is paid for, the races
with exact early rejection, and the verdict it reaches (written through :class:`Verdicts`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from fractions import Fraction

import dspy

from ...config import EVAL_CHUNK_SIZE, AgentGradConfig
from ...program.evaluation import Evaluator
from ...program.objectives import guard_violations, objective_means
from ...program.program_state import ProgramState
from ...program.runs import Outcome
from ...runtime.budget import Budget, BudgetExhausted
from ..events import Dispatcher, ValidationScored
from ..state import CandidateRecord, Cluster, RunState, exact_total
from .verdicts import Verdicts

logger = logging.getLogger("dspy.agentgrad")


@dataclass
class RaceResult:
    """A candidate scored against a bar: its total, or the proof that it cannot clear the bar."""

    total: Fraction | None  # exact sum of scores over all examples; None when stopped early
    scored: int  # examples scored before the decision

    @property
    def stopped_early(self) -> bool:
        """True when scoring stopped because the candidate could no longer clear the bar."""
        return self.total is None


def cannot_clear(best_possible: Fraction, bar: Fraction, strict: bool) -> bool:
    """True when a total of at most ``best_possible`` cannot pass ``bar`` (``> bar``, or ``>= bar``)."""
    return best_possible <= bar if strict else best_possible < bar


def race(
    evaluator: Evaluator,
    instructions: ProgramState,
    examples: list[dspy.Example],
    phase: str,
    bar: Fraction,
    *,
    strict: bool,
    max_score: float,
    chunk_size: int,
) -> RaceResult:
    """Score ``examples`` in order, in chunks of ``chunk_size``, until the total can no longer pass ``bar``.

    Exact early rejection: after each chunk, if even ``max_score`` on every example left could not
    give a total above ``bar`` (at least ``bar`` when not ``strict``), scoring stops. The chunks
    are fixed and decided between, so the decision and the metric calls spent are the same at
    any thread count.
    """
    total, done, top = Fraction(0), 0, Fraction(max_score)
    for start in range(0, len(examples), chunk_size):
        chunk = examples[start : start + chunk_size]
        total += exact_total(evaluator.evaluate(instructions, chunk, phase))
        done += len(chunk)
        left = len(examples) - done
        if left and cannot_clear(total + left * top, bar, strict):
            return RaceResult(None, done)
    return RaceResult(total, done)


def validation_verdict(total: Fraction, bar: Fraction) -> str:
    """The reason a candidate that won its cluster is kept with validation total ``total`` over the bar ``bar``."""
    return "gain on cluster and validation" if total > bar else "gain on cluster, equal on validation"


def gain_survives_dropping_best(outcomes: list[Outcome], best_scores: list[float]) -> bool:
    """``val_acceptance="robust"``: the candidate is still strictly ahead of the best program with the example it
    gains most on left out. On a handful of validation examples one lucky example can carry the mean; a gain that
    one example decides is not kept (the other examples must gain more than they lose)."""
    gains = [Fraction(o.score) - Fraction(b) for o, b in zip(outcomes, best_scores)]
    return sum(gains) - max(gains, default=Fraction(0)) > 0


class Acceptance:
    """Two-stage acceptance with exact early rejection, and what a check may cost.

    Judging is in one place so that the decision, its arithmetic and its affordability cannot
    drift apart: the engine asks whether a check fits, then for the verdict.
    """

    def __init__(
        self,
        config: AgentGradConfig,
        evaluator: Evaluator,
        budget: Budget,
        valset: list[dspy.Example],
        state: RunState,
        emit: Dispatcher,
        verdicts: Verdicts,
    ):
        self.config = config
        self.evaluator = evaluator
        self.budget = budget
        self.valset = valset
        self.state = state
        self.emit = emit
        self.verdicts = verdicts

    def check_cost(self, program: ProgramState, cluster: Cluster) -> int:
        """The most metric calls judging a candidate for ``cluster`` on ``program`` can take: the cluster's
        runs under ``program`` not paid yet, its runs under the candidate, and one validation pass."""
        examples = [g.record.example for g in cluster.members]
        return self.evaluator.cost(program, examples) + len(examples) + len(self.valset)

    def affordable(self, program: ProgramState, cluster: Cluster) -> bool:
        """Whether the budget left covers the worst case of a check (see :meth:`check_cost`)."""
        return self.check_cost(program, cluster) <= self.budget.remaining()

    def require_affordable(self, cluster: Cluster) -> None:
        """Stop the run before paying for a rewrite whose check the budget could not finish."""
        needed = self.check_cost(self.state.instructions, cluster)
        if needed > self.budget.remaining():
            raise BudgetExhausted(f"the next candidate check needs up to {needed} metric calls")

    def judge(self, record: CandidateRecord, candidate: ProgramState, examples: list[dspy.Example]) -> None:
        """Write the verdict into ``record``: a gain on the cluster first, then on validation."""
        if self.cluster_check(record, self.state.instructions, candidate, examples):
            self.validate(record, candidate)

    def cluster_check(
        self,
        record: CandidateRecord,
        program: ProgramState,
        candidate: ProgramState,
        examples: list[dspy.Example],
    ) -> bool:
        """Whether ``candidate`` beats ``program`` on its cluster's examples (both scores go into ``record``)."""
        chunk, top = EVAL_CHUNK_SIZE, self.config.scores.max_score
        if len(examples) <= chunk:  # one batch for both sides of the cluster check
            before_out, after_out = self.evaluator.evaluate_many(
                [(program, examples), (candidate, examples)], "minibatch"
            )
            before, after = exact_total(before_out), exact_total(after_out)
        else:
            before = exact_total(self.evaluator.evaluate(program, examples, "minibatch"))
            after = race(
                self.evaluator, candidate, examples, "minibatch", before, strict=True, max_score=top, chunk_size=chunk
            ).total
        record.cluster_score_before = float(before / len(examples))
        record.cluster_score_after = None if after is None else float(after / len(examples))
        if after is None or after <= before:
            self.verdicts.reject(record, "no gain on its cluster")
            return False
        return True

    def validate(self, record: CandidateRecord, candidate: ProgramState) -> bool:
        """Whether ``candidate`` beats the best program on validation (the verdict goes into ``record``).

        An accepted candidate's validation scores become the new bar (the caller installs the candidate).
        """
        strict = self.config.judging.val_acceptance != "non_decreasing"  # "robust" is strict, and more
        total = self._validation_total(record, candidate, strict)
        if total is None:
            return False
        state = self.state
        if cannot_clear(total, state.best_val_total, strict):
            self.verdicts.reject(record, "no gain on validation")
            return False
        outcomes = self.evaluator.evaluate(candidate, self.valset, "validate")  # all cached: free
        if self.config.judging.val_acceptance == "robust" and not gain_survives_dropping_best(
            outcomes, state.best_val_scores
        ):
            self.verdicts.reject(record, "its gain on validation rests on one example")
            return False
        if self._guard_blocks(record, outcomes):
            return False
        self.verdicts.accept(record, validation_verdict(total, state.best_val_total))
        state.set_best(outcomes)
        return True

    def costliest_winner(
        self, left_out: list[tuple[CandidateRecord, ProgramState]], before: list[float]
    ) -> CandidateRecord | None:
        """The winner of an accepted stack (now the best program) to leave out on a full pass, or None.

        Where the stack scores below the program before it (``before``), each ``(winner, the stack without it)``
        is scored on those examples only; the winner whose absence wins back most is returned. None when no
        validation example got worse, no absence wins anything back, or the budget cannot pay these runs and
        the full pass after them."""
        gains = self.win_backs([program for _, program in left_out], before)
        if gains is None:
            return None
        gain, winner = max(zip(gains, (record for record, _ in left_out)), key=lambda x: x[0])
        return winner if gain > 0 else None

    def win_backs(self, left_out: list[ProgramState], before: list[float]) -> list[Fraction] | None:
        """What each program of ``left_out`` (the best program with one change left out) wins back over the best
        program on the validation examples where the best scores below ``before``, scored on those examples only.
        None, and nothing paid, when no example got worse or the budget cannot pay these runs and a full pass."""
        after = self.state.best_val_scores
        worse = [i for i, (old, new) in enumerate(zip(before, after)) if new < old]
        if not worse:
            return None
        examples = [self.valset[i] for i in worse]
        needed = sum(self.evaluator.cost(program, examples) for program in left_out) + len(self.valset)
        if needed > self.budget.remaining():
            logger.info(
                "round %d: no budget left to score the best program without each change", self.state.round_index
            )
            return None
        outcomes = self.evaluator.evaluate_many([(program, examples) for program in left_out], "validate")
        best_total = sum(Fraction(after[i]) for i in worse)
        return [exact_total(o) - best_total for o in outcomes]

    def replaces_stack(self, record: CandidateRecord, without: ProgramState) -> bool:
        """Whether the accepted stack without one of its winners (``without``) does better on validation, so that the
        winner goes (a tie keeps it, as ties keep a candidate). When it goes, ``without``'s scores become the bar
        (the caller installs it)."""
        total = self._validation_total(record, without, strict=True)
        if total is None or cannot_clear(total, self.state.best_val_total, strict=True):
            return False
        outcomes = self.evaluator.evaluate(without, self.valset, "validate")  # all cached: free
        if self._guard_blocks(record, outcomes):
            return False
        self.state.set_best(outcomes)
        return True

    def _guard_blocks(self, record: CandidateRecord, outcomes: list[Outcome]) -> bool:
        """Record the candidate's objectives on validation; True (with the reason) when a guarded one falls
        below the best program's by more than its tolerance (``objective_guards``)."""
        record.objectives = objective_means(o.objectives for o in outcomes)
        fell = guard_violations(self.config.judging.objective_guards, self.state.best_val_objectives, record.objectives)
        if fell:
            self.verdicts.reject(record, "a guarded objective fell on validation: " + "; ".join(fell))
        return bool(fell)

    def _validation_total(self, record: CandidateRecord, candidate: ProgramState, strict: bool) -> Fraction | None:
        """``candidate``'s exact validation total, or None once it cannot clear the best program's (``strict``: pass
        it; otherwise reach it); its score and when it was paid go into ``record``.

        Validation scores the examples the best program does worst on first, where a losing candidate shows it
        soonest.
        """
        state = self.state
        order = sorted(range(len(self.valset)), key=lambda i: (state.best_val_scores[i], i))
        result = race(
            self.evaluator,
            candidate,
            [self.valset[i] for i in order],
            "validate",
            state.best_val_total,
            strict=strict,
            max_score=self.config.scores.max_score,
            chunk_size=EVAL_CHUNK_SIZE,
        )
        if result.stopped_early:
            self.verdicts.reject(
                record, f"no gain on validation (stopped after {result.scored}/{len(self.valset)}: cannot win)"
            )
            return None
        record.val_score, record.validated_at = float(result.total / len(self.valset)), self.budget.metric_calls
        self.emit(
            "on_validation_scored",
            ValidationScored(
                state.round_index,
                record.val_score,
                max(record.val_score, state.best_val_score),
                self.budget.metric_calls,
                record,
            ),
        )
        return result.total
