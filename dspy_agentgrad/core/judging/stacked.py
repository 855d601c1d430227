"""The stacked judge (``validate_together``, windows of ``stack_rounds``): a stack of winners, one validation pass.

Each rewrite is made and checked on its cluster on top of the winners before it, as it would be after their
acceptance; the stack then takes one validation pass instead of one per winner. A candidate is never kept on a
program other than the one it won its cluster on: where that program will not exist, it is judged again, one at a
time, by the paper's judge.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from ...program.program_state import ProgramState
from ...runtime.budget import BudgetExhausted
from ..events import StopRun
from ..round_rules import RoundRules
from ..sources.rewrites import RewriteSource
from ..state import CandidateRecord, Cluster, RoundRecord, exact_sum
from .acceptance import validation_verdict
from .sequential import SequentialJudge

logger = logging.getLogger("dspy.agentgrad")
#: A loser's reason while its check, made on top of winners of its stack that were not all kept, waits to be made again.
#: Marks a verdict reached on a stack that a stop cut short (see :meth:`StackedJudge._mark_cut_short`).
CUT_SHORT = "judged on a stack cut short"
LOST_ON_A_STACK = "lost its cluster on top of a winner that was not kept; the run stopped before it was judged again"


@dataclass
class Checked:
    """A candidate of a stack, checked on its cluster on top of the stack's winners before it: ``checked_on`` is the
    program that check ran on, ``won`` whether the candidate beat it there. The check stands only while the
    candidate would be installed on that same program; otherwise the candidate is judged again."""

    record: CandidateRecord
    cluster: Cluster
    checked_on: ProgramState
    won: bool


@dataclass
class Provisional:
    """A stack of winners not validated yet (across rounds with ``stack_rounds``): ``validated`` is the program they
    build on (the best one validated); ``checked``: every candidate checked on top of them, winners and losers, in
    the order they were checked."""

    validated: ProgramState
    checked: list[Checked]

    @property
    def winners(self) -> list[CandidateRecord]:
        return [item.record for item in self.checked if item.won]

    @property
    def program(self) -> ProgramState:
        """The stack: ``validated`` with every winner's rewrite."""
        return _stacked(self.validated, self.winners)


def _stacked(program: ProgramState, winners: list[CandidateRecord]) -> ProgramState:
    """``program`` with each winner's rewrite, in order."""
    for record in winners:
        program = program.with_instruction(record.predictor, record.instruction)
    return program


class StackedJudge:
    """Rewrites judged on a stack of the window's winners; ``one_at_a_time`` judges what the stack cannot keep.

    ``rules``: the rounds are grouped in windows (:meth:`RoundRules.closes_window`), and a window's winners share the
    pass at its last round; until then they stay installed unvalidated (:class:`Provisional`) and the next round
    attributes and rewrites on top of them.
    """

    def __init__(self, one_at_a_time: SequentialJudge, rewrites: RewriteSource, rules: RoundRules):
        self.one_at_a_time = one_at_a_time
        self.parts = one_at_a_time.parts
        self.rewrites = rewrites
        self.rules = rules
        self._provisional: Provisional | None = None  # winners waiting for a later round's pass
        self._stack_lost_at: int | None = None  # the last round whose validation pass did not keep every winner

    def validates_this_round(self) -> bool:
        return not self._waits()

    def waiting(self) -> list[CandidateRecord]:
        return self._provisional.winners if self._provisional else []

    def judge_round(
        self, ready: list[Cluster], minimum: int, round_record: RoundRecord, judged: list[CandidateRecord]
    ) -> None:
        """The round's clusters, each rewrite made on the stack of the winners before it and checked on its cluster
        there; then the stack's validation pass (:meth:`_validate_stack`), or, until the window's last round, the
        winners stay installed and wait. Candidates with a verdict go into ``judged``, also when the run stops
        half-way; winners that wait go into it with the round that validates them."""
        if not (ready or self._provisional):
            return
        parts, acceptance = self.parts, self.parts.acceptance
        parts.before_judging()
        stack = self._provisional or Provisional(parts.state.instructions, [])
        self._provisional = stack  # from here a stop settles it (see settle)
        parts.budget.set_aside(0)  # the checks below keep a validation pass affordable
        program, short = stack.program, None
        for cluster in ready:
            if not acceptance.affordable(program, cluster):  # its checks and one validation pass
                if not judged and not stack.checked:
                    self._provisional = None
                    acceptance.require_affordable(cluster)
                short = acceptance.check_cost(program, cluster)
                break  # the stack so far gets its validation pass, then the run stops as one at a time would
            record, candidate = self.rewrites.propose(cluster, minimum, program)
            if candidate is None:
                judged.append(record)
                parts.verdicts.close()
                continue
            start = parts.budget.metric_calls
            won = acceptance.cluster_check(record, program, candidate, [g.record.example for g in cluster.members])
            record.metric_calls = parts.budget.metric_calls - start
            if won:
                parts.verdicts.reject(record, "won its cluster; the run stopped before its stack's validation pass")
            if won or stack.winners:
                stack.checked.append(Checked(record, cluster, program, won))
            else:
                judged.append(record)
            parts.verdicts.close()
            program = candidate if won else program
        out_of_budget = BudgetExhausted(f"the next candidate check needs up to {short} metric calls")
        if not stack.winners:
            self._provisional = None
            if short is not None:
                raise out_of_budget
            return
        needed = parts.evaluator.cost(program, parts.valset)
        if short is None and self._waits() and needed <= parts.budget.remaining():  # waits for the next round
            parts.state.instructions = program
            parts.budget.set_aside(needed)  # its validation pass stays paid for
            return
        self._provisional = None
        pruned: list[CandidateRecord] = []
        try:
            self._validate_stack(stack, pruned)
        finally:
            judged.extend(item.record for item in stack.checked)
            judged.extend(pruned)
            if short is not None:
                self._mark_cut_short(stack, "the budget ran out before the round's other clusters were checked")
        if not all(winner.accepted for winner in stack.winners):
            self._stack_lost_at = parts.state.round_index
        if short is not None:
            raise out_of_budget

    def settle(self, validate: bool, stopped: bool = False) -> None:
        """A stack still waiting gets its pass when ``validate`` and the budget allows; otherwise the program goes
        back to the last validated one. Its candidates are recorded either way (a stop callback asking again, at
        their verdicts, changes nothing: the run is ending)."""
        pending, self._provisional = self._provisional, None
        if pending is None:
            return
        parts = self.parts
        parts.budget.set_aside(0)
        parts.state.instructions = pending.validated
        affordable = parts.evaluator.cost(pending.program, parts.valset) <= parts.budget.remaining()
        pruned: list[CandidateRecord] = []
        if validate and pending.winners and affordable:
            try:
                self._validate_stack(pending, pruned)
            except (BudgetExhausted, StopRun) as stop:  # a cap or a callback: what was accepted before it stays
                logger.info("the last stack's validation did not finish: %s", stop)
            if stopped:
                self._mark_cut_short(pending, "the run stopped before its window's last round")
        last = parts.state.rounds[-1]
        last.best_val_score, last.metric_calls = parts.state.best_val_score, parts.budget.metric_calls
        try:
            parts.verdicts.record(last, [item.record for item in pending.checked] + pruned)
        except StopRun:
            pass

    def _mark_cut_short(self, stack: Provisional, why: str) -> None:
        """Say so on each verdict of a stack judged without the winners that would have joined it: a longer run
        (more budget, or calls saved by reuse) can reach another verdict on the same candidates."""
        for item in stack.checked:
            if item.record.reason:
                self.parts.verdicts.extend(item.record, f"; {CUT_SHORT}: {why}")

    def _waits(self) -> bool:
        """Whether this round's winners wait, unvalidated, for the next round's: until the round that closes their
        window (:meth:`RoundRules.closes_window`).

        The round after one whose pass did not keep every winner validates its own: a rewrite that wins its cluster
        and breaks other examples, left waiting, would also spoil the next round's attribution (its failures are
        hard cases on top of it), and where such rewrites keep coming that would repeat in every window."""
        round_index = self.parts.state.round_index
        if self._stack_lost_at is not None and round_index - self._stack_lost_at <= 1:
            return False
        return not self.rules.closes_window(round_index)

    def _validate_stack(self, stack: Provisional, pruned: list[CandidateRecord]) -> None:
        """The stack's verdicts (:meth:`_judge_stack`), then the sentences its kept winners added pruned
        (``prune_rewrites``); the removals judged go into ``pruned``, to be recorded."""
        before = list(self.parts.state.best_val_scores)
        self._judge_stack(stack, before)
        self.one_at_a_time.prune([item.record for item in stack.checked if item.record.accepted], before, pruned)

    def _judge_stack(self, stack: Provisional, before: list[float]) -> None:
        """One validation pass for the stack's winners, on the validated program they build on (which scored
        ``before`` on validation).

        When it is kept on a tie, a winner that costs more than it gives is left out (:meth:`_drop_harmful`); every
        check still stands where each kept winner is installed on the program it won its cluster on, and a loser
        whose check stood on a winner left out is judged again (:meth:`_judge_again`). Otherwise (the stack lost, or
        a kept winner's check stood on one left out) the stack's candidates are judged one at a time, in the order
        they were checked, from the validated program (:meth:`_judge_one_by_one`), as the paper's judge would.
        """
        parts = self.parts
        base, winners = stack.validated, stack.winners
        parts.state.instructions = base
        start, last = parts.budget.metric_calls, winners[-1]
        together = parts.acceptance.validate(last, stack.program)
        last.metric_calls += parts.budget.metric_calls - start
        if together:
            parts.verdicts.accept_together(winners, last)
            self.one_at_a_time.install(stack.program)
            self._drop_harmful(base, winners, before)
            if self._checks_stand(stack):
                self._judge_again(stack)
                return
            logger.info("round %d: a kept winner won its cluster on a winner left out", parts.state.round_index)
        elif len(winners) == 1:
            self._judge_again(stack)  # the winner's verdict stands; the losers above it are judged again
            return
        else:
            logger.info("round %d: the stack of %d winners lost on validation", parts.state.round_index, len(winners))
        parts.state.instructions = base
        parts.state.set_best_scores(before)
        self._judge_one_by_one(stack)

    @staticmethod
    def _checks_stand(stack: Provisional) -> bool:
        """Whether each kept winner is installed on the program it won its cluster on."""
        program = stack.validated
        for item in stack.checked:
            if item.won and item.record.accepted:
                if item.checked_on != program:
                    return False
                program = program.with_instruction(item.record.predictor, item.record.instruction)
        return True

    def _judge_again(self, stack: Provisional) -> None:
        """After the stack's pass: judge again, on the program now validated, each candidate that lost its cluster
        check on a program that will not exist (a winner below it was not kept): a harmful rewrite must not also
        block the ones checked after it."""
        program, again = stack.validated, []  # the program at each candidate's place: validated, and kept winners
        for item in stack.checked:
            if item.won:
                if item.record.accepted:
                    program = program.with_instruction(item.record.predictor, item.record.instruction)
            elif item.checked_on != program:
                self.parts.verdicts.reject(item.record, LOST_ON_A_STACK)
                again.append(item)
        for item in again:
            self._judge_on_current(item)

    def _judge_one_by_one(self, stack: Provisional) -> None:
        """Judge the stack's candidates in order on the current program, as the paper's judge would: a check made on
        the program a candidate lands on stands (a winner is then validated alone), any other is made again. A
        stop on the way leaves the candidates not reached unaccepted, their records saying why."""
        verdicts = self.parts.verdicts
        for item in stack.checked:
            if item.won:
                verdicts.withdraw(
                    item.record, "won its cluster; its stack lost validation and the run stopped before it was judged"
                )
            elif item.checked_on != stack.validated:
                verdicts.reject(item.record, LOST_ON_A_STACK)
        for item in stack.checked:
            if item.checked_on != self.parts.state.instructions:
                self._judge_on_current(item)
            elif item.won:
                self._validate_alone(item.record)

    def _judge_on_current(self, item: Checked) -> None:
        """Judge ``item`` again, on its cluster and on validation, on the current program."""
        parts, record = self.parts, item.record
        if not parts.acceptance.affordable(parts.state.instructions, item.cluster):
            parts.verdicts.extend(record, "; not judged again on the program it would be installed on: no budget left")
            raise BudgetExhausted("the next candidate check, on the program it would be installed on, cannot be paid")
        parts.verdicts.reopen(record)
        paid = record.metric_calls
        candidate = parts.state.instructions.with_instruction(record.predictor, record.instruction)
        self.one_at_a_time.judge(record, candidate, item.cluster)
        record.metric_calls += paid
        parts.verdicts.extend(record, " (judged again on the program it would be installed on)")

    def _validate_alone(self, record: CandidateRecord) -> None:
        """A winner of its cluster on the current program, validated alone (after its stack lost)."""
        parts = self.parts
        candidate = parts.state.instructions.with_instruction(record.predictor, record.instruction)
        needed = parts.evaluator.cost(candidate, parts.valset)
        if needed > parts.budget.remaining():
            raise BudgetExhausted(f"the next validation pass needs up to {needed} metric calls")
        start = parts.budget.metric_calls
        if parts.acceptance.validate(record, candidate):
            self.one_at_a_time.install(candidate)
        record.metric_calls += parts.budget.metric_calls - start

    def _drop_harmful(self, base: ProgramState, winners: list[CandidateRecord], before: list[float]) -> None:
        """Leave out a winner of a stack kept on a tie that costs more than it gives.

        With ties accepted, a stack can be kept with no gain over the program before it (``before``) while one rewrite
        breaks what the others fix. Where such a stack scores below that program on some validation examples, each
        winner is left out on those examples only; the one whose absence wins back most is left out on a full pass,
        and dropped if the stack without it does better (which then has a gain); nothing is paid when no validation
        example got worse. The stack without it replaces the stack in the validation history, and the
        kept winners share its pass. A stack kept with a gain keeps every winner: checking those too cost validation
        passes and no test score on the zoo (docs/zoo.md); pruning and the failures a harmful rewrite makes in later
        rounds are what undo it there.
        """
        parts, bar = self.parts, exact_sum(before)
        if len(winners) < 2 or parts.state.best_val_total != bar:
            return
        without = {id(r): _stacked(base, [w for w in winners if w is not r]) for r in winners}
        suspect = parts.acceptance.costliest_winner([(r, without[id(r)]) for r in winners], before)
        if suspect is None:
            return
        stack_score, trial = parts.state.best_val_score, replace(suspect)
        start = parts.budget.metric_calls
        goes = parts.acceptance.replaces_stack(trial, without[id(suspect)])
        suspect.metric_calls += parts.budget.metric_calls - start
        if not goes:
            return
        kept = [w for w in winners if w is not suspect]
        self.one_at_a_time.install(without[id(suspect)], replacing=True)
        parts.verdicts.reject(
            suspect,
            f"won its cluster and its stack's validation, but the stack without it did better "
            f"({trial.val_score:.4f} against {stack_score:.4f})",
        )
        top = kept[-1]  # the kept winners share the pass without the one that left, as a stack's winners do
        top.val_score, top.validated_at = trial.val_score, trial.validated_at
        top.reason = validation_verdict(parts.state.best_val_total, bar)
        parts.verdicts.accept_together(kept, top)
        logger.info(
            "round %d: %s's rewrite left the stack: validation %.4f without it, %.4f with it",
            suspect.round,
            suspect.predictor,
            trial.val_score,
            stack_score,
        )
