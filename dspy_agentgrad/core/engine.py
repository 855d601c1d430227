"""The AgentGrad round engine.

One round: failure set -> sequential intervention in reverse execution order ->
gradient per attributed failure -> semantic abstraction under the cyclic
minimum-cluster-size schedule -> updates in descending cluster size with
two-stage acceptance. The engine owns the loop and its stop rules and reports
each step as a typed event (:mod:`dspy_agentgrad.core.events`). Steps 1-2 are the
:class:`~dspy_agentgrad.core.attribution.Attributor`'s. It makes no LM call itself:
program runs go through the :class:`Evaluator`, LM roles through the :class:`Proposer`.
"""

from __future__ import annotations

import contextvars
import logging
import random
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from itertools import chain

import dspy

from ..config import AgentGradConfig
from ..program.evaluation import Evaluator
from ..program.objectives import check_guarded_objectives
from ..program.program_state import ProgramState
from ..program.runs import Outcome
from ..roles.proposer import Proposer, format_fields
from ..runtime.budget import Budget, BudgetExhausted
from ..runtime.jsonable import example_key
from ..runtime.parallel import in_background, shared_threads
from .abstraction import Abstraction
from .acceptance import Acceptance
from .attribution import Attribution, Attributor, HintFn
from .clustering import min_cluster_size
from .demonstrations import added_demos, pooled
from .events import (
    AttributionDone,
    CandidateJudged,
    CandidateProposed,
    Dispatcher,
    RoundEnd,
    RoundStart,
    RunEnd,
    RunStart,
    StopRun,
    ValidationScored,
)
from .rewriting import Rewriter
from .speculation import Speculation, speculation_helps
from .state import CandidateRecord, Cluster, Gradient, RoundRecord, RunState, example_label

logger = logging.getLogger("dspy.agentgrad")
#: A loser's reason while its check, made on top of winners of its stack that were not all kept, waits to be made again.
LOST_ON_A_STACK = "lost its cluster on top of a winner that was not kept; the run stopped before it was judged again"
VALIDATION_PASS = "starting validation"  # the budget's purpose for the starting program's validation pass


class BatchSampler:
    """Epoch-shuffled training batches, reproducible from the seed."""

    def __init__(self, size: int, batch_size: int, rng: random.Random):
        self.size, self.batch_size, self.rng = size, min(batch_size, size), rng
        self.queue: list[int] = []

    def next(self) -> list[int]:
        """The next training batch: every example once per epoch before any repeats.

        A batch that spans two epochs takes from the new one only examples it does not hold yet; the ones it
        holds stay queued for the next batch (dropping them would skip them for a whole epoch).
        """
        batch: list[int] = []
        while len(batch) < self.batch_size:
            if not self.queue:
                self.queue = list(range(self.size))
                self.rng.shuffle(self.queue)
            index = next(i for i in self.queue if i not in batch)  # exists: a batch is never larger than an epoch
            self.queue.remove(index)
            batch.append(index)
        return batch


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
    """A stack of winners not validated yet (``validate_together``; across rounds with ``stack_rounds``):
    ``validated`` is the program they build on (the best one validated); ``checked``: every candidate checked on top
    of them, winners and losers, in the order they were checked."""

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


class RoundEngine:
    """The loop of rounds and its stop rules; each step is delegated to the part of the paper it is.

    It owns the run's :class:`RunState` and reports each step as an event. Steps 1-2 are the
    :class:`Attributor`'s, 3-4 the :class:`Abstraction`'s, step 5 the :class:`Rewriter`'s and the
    :class:`Acceptance`'s; :class:`Speculation` pays ahead for what a round will ask.
    """

    def __init__(
        self,
        config: AgentGradConfig,
        evaluator: Evaluator,
        proposer: Proposer,
        budget: Budget,
        hint_fn: HintFn,
        signatures: dict[str, str],
        state: RunState,
        trainset: list[dspy.Example],
        valset: list[dspy.Example],
        emit: Dispatcher | None = None,
    ):
        config = config.with_options(speculate=speculation_helps(config, budget))
        if budget.task_capped:  # runs in flight together would race for the cap: which one it refuses is timing
            evaluator.num_threads = 1  # one program run at a time, in order: the same stop at any thread count
        self.config = config
        self.evaluator = evaluator
        self.budget = budget
        self.state = state
        self.trainset = trainset
        self.valset = valset
        self.emit = emit or Dispatcher()
        self.rng = random.Random(config.execution.seed)
        self.sampler = BatchSampler(len(trainset), config.attribution.train_batch_size, self.rng)
        self.attributor = Attributor(config, evaluator, hint_fn)
        self.abstraction = Abstraction(config, proposer, signatures, self.rng)
        self.rewriter = Rewriter(config, proposer, signatures, state)
        self.acceptance = Acceptance(config, evaluator, budget, valset, state, self.emit)
        self.speculation = Speculation(
            config, evaluator, proposer, budget, valset, state, self.rewriter, self.acceptance
        )
        self._validation: Future | None = None  # the starting program's validation pass, while it runs
        self._provisional: Provisional | None = None  # winners waiting for the next round's (``stack_rounds``)
        self._stack_lost_at: int | None = None  # the last round whose validation pass did not keep every winner
        self._attributed: ProgramState | None = None  # the program the last round's failures were measured on
        self._judging: CandidateRecord | None = None  # the candidate being judged, not recorded yet

    def attribute(self, examples: list[dspy.Example], phase: str = "evaluate") -> Attribution:
        """Steps 1-2 for the current program: failure set and sequential intervention (see :class:`Attributor`)."""
        return self.attributor.attribute(self.state.instructions, examples, self.state.round_index, phase)

    def update(self, cluster: Cluster, minimum: int) -> CandidateRecord:
        """Step 5 for one cluster: a rewrite, then two-stage acceptance with exact early rejection.

        The candidate must beat the current program on its cluster, then on validation
        (``val_acceptance``: strictly, at least equal, or strictly without its best example); see
        :class:`Acceptance`. An accepted candidate becomes the current program.
        """
        self.finish_validation()
        state = self.state
        self.acceptance.require_affordable(cluster)  # checked before paying for the rewrite
        record, candidate = self._propose(cluster, minimum, state.instructions)
        if candidate is not None:
            self._judge(record, candidate, cluster)
        return record

    def update_together(self, ready: list[Cluster], minimum: int, judged: list[CandidateRecord]) -> None:
        """Step 5 for the round's clusters, the winners validated together (``validate_together``).

        Each rewrite is made on top of the round's earlier winners and must beat that stack on its own
        cluster (as it would after their acceptance); the stack of winners then takes one validation
        pass instead of one per candidate (:meth:`_validate_stack`). A candidate is never kept on a program other
        than the one it won its cluster on: where a winner below it is not kept, it is judged again, on its cluster
        and on validation, on the program it would be installed on. Candidates with a verdict go into ``judged``,
        also when the run stops half-way.

        With ``stack_rounds`` above 1 the stack spans a window of that many rounds: until the window's last round,
        its winners stay installed unvalidated (:class:`Provisional`), the next round attributes and rewrites on
        top of them, and they go into ``judged`` with the round that validates them.
        """
        self.finish_validation()
        stack = self._provisional or Provisional(self.state.instructions, [])
        self._provisional = stack  # from here a stop settles it (see _settle_provisional)
        self.budget.set_aside(0)  # the checks below keep a validation pass affordable
        program, short = stack.program, None
        for cluster in ready:
            if not self.acceptance.affordable(program, cluster):  # its checks and one validation pass
                if not judged and not stack.checked:
                    self._provisional = None
                    self.acceptance.require_affordable(cluster)
                short = self.acceptance.check_cost(program, cluster)
                break  # the stack so far gets its validation pass, then the run stops as one at a time would
            record, candidate = self._propose(cluster, minimum, program)
            if candidate is None:
                judged.append(record)
                self._judging = None
                continue
            start = self.budget.metric_calls
            won = self.acceptance.cluster_check(record, program, candidate, [g.record.example for g in cluster.members])
            record.metric_calls = self.budget.metric_calls - start
            if won:
                record.reason = "won its cluster; the run stopped before its stack's validation pass"
            if won or stack.winners:
                stack.checked.append(Checked(record, cluster, program, won))
            else:
                judged.append(record)
            self._judging = None
            program = candidate if won else program
        out_of_budget = BudgetExhausted(f"the next candidate check needs up to {short} metric calls")
        if not stack.winners:
            self._provisional = None
            if short is not None:
                raise out_of_budget
            return
        needed = self.evaluator.cost(program, self.valset)
        if short is None and self._stack_waits() and needed <= self.budget.remaining():  # waits for the next round
            self.state.instructions = program
            self.budget.set_aside(needed)  # its validation pass stays paid for
            return
        self._provisional = None
        try:
            self._validate_stack(stack)
        finally:
            judged.extend(item.record for item in stack.checked)
        if not all(winner.accepted for winner in stack.winners):
            self._stack_lost_at = self.state.round_index
        if short is not None:
            raise out_of_budget

    def _validate_stack(self, stack: Provisional) -> None:
        """One validation pass for the stack's winners, on the validated program they build on.

        When it wins, a winner that costs more than it gives is left out (:meth:`_drop_harmful`); every check still
        stands where each kept winner is installed on the program it won its cluster on, and a loser whose check
        stood on a winner left out is judged again (:meth:`_judge_again`). Otherwise (the stack lost, or a kept
        winner's check stood on one left out) the stack's candidates are judged one at a time, in the order they
        were checked, from the validated program (:meth:`_judge_one_by_one`), as :meth:`update` would judge them.
        """
        base, winners = stack.validated, stack.winners
        self.state.instructions = base
        before = list(self.state.best_val_scores)
        start, last = self.budget.metric_calls, winners[-1]
        together = self.acceptance.validate(last, stack.program)
        last.metric_calls += self.budget.metric_calls - start
        if together:
            for record in winners:
                record.accepted, record.val_score, record.validated_at = True, last.val_score, last.validated_at
                if len(winners) > 1:
                    record.reason = f"{last.reason}, validated with {len(winners) - 1} other winner(s)"
            self._install(stack.program)
            self._drop_harmful(base, winners, before)
            if self._checks_stand(stack):
                self._judge_again(stack)
                return
            logger.info("round %d: a kept winner won its cluster on a winner left out", self.state.round_index)
        elif len(winners) == 1:
            self._judge_again(stack)  # the winner's verdict stands; the losers above it are judged again
            return
        else:
            logger.info("round %d: the stack of %d winners lost on validation", self.state.round_index, len(winners))
        self.state.instructions = base
        self.state.set_best_scores(before)
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
                item.record.reason = LOST_ON_A_STACK
                again.append(item)
        for item in again:
            self._judge_on_current(item)

    def _judge_one_by_one(self, stack: Provisional) -> None:
        """Judge the stack's candidates in order on the current program, as :meth:`update` would: a check made on
        the program a candidate lands on stands (a winner is then validated alone), any other is made again. A
        stop on the way leaves the candidates not reached unaccepted, their records saying why."""
        for item in stack.checked:
            record = item.record
            if item.won:
                record.accepted, record.val_score, record.validated_at = False, None, None
                record.reason = "won its cluster; its stack lost validation and the run stopped before it was judged"
            elif item.checked_on != stack.validated:
                record.reason = LOST_ON_A_STACK
        for item in stack.checked:
            if item.checked_on != self.state.instructions:
                self._judge_on_current(item)
            elif item.won:
                self._validate_alone(item.record)

    def _judge_on_current(self, item: Checked) -> None:
        """Judge ``item`` again, on its cluster and on validation, on the current program."""
        record = item.record
        if not self.acceptance.affordable(self.state.instructions, item.cluster):
            record.reason += "; not judged again on the program it would be installed on: no budget left"
            raise BudgetExhausted("the next candidate check, on the program it would be installed on, cannot be paid")
        record.cluster_score_before = record.cluster_score_after = None
        record.accepted, record.val_score, record.validated_at = False, None, None
        paid = record.metric_calls
        candidate = self.state.instructions.with_instruction(record.predictor, record.instruction)
        self._judge(record, candidate, item.cluster)
        record.metric_calls += paid
        record.reason += " (judged again on the program it would be installed on)"

    def _drop_harmful(self, base: ProgramState, winners: list[CandidateRecord], before: list[float]) -> None:
        """Leave out a stacked winner that costs more than it gives.

        A stack's single pass sees only the sum: a rewrite that wins its own cluster but breaks other examples can
        ride along with winners that gain more. Where the accepted stack scores below the program before it
        (``before``), each winner is left out on those examples only; the one whose absence wins back most is
        left out on a full pass, and dropped if the stack without it does at least as well (a winner must gain, as
        when judged alone). Repeated while a winner can go; nothing is paid when no validation example got worse.
        """
        kept = list(winners)
        while len(kept) > 1:
            without = {id(r): _stacked(base, [w for w in kept if w is not r]) for r in kept}
            suspect = self.acceptance.costliest_winner([(r, without[id(r)]) for r in kept], before)
            if suspect is None:
                return
            stack_score, trial = self.state.best_val_score, replace(suspect)
            start = self.budget.metric_calls
            goes = self.acceptance.replaces_stack(trial, without[id(suspect)])
            suspect.metric_calls += self.budget.metric_calls - start
            if not goes:
                return
            kept.remove(suspect)
            self._install(without[id(suspect)])
            suspect.accepted, suspect.val_score = False, trial.val_score
            suspect.reason = (
                f"won its cluster and its stack's validation, but the stack without it did as well or better "
                f"({trial.val_score:.4f} against {stack_score:.4f})"
            )
            for record in kept:
                record.val_score, record.validated_at = trial.val_score, trial.validated_at
            logger.info(
                "round %d: %s's rewrite left the stack: validation %.4f without it, %.4f with it",
                suspect.round,
                suspect.predictor,
                trial.val_score,
                stack_score,
            )

    def _settle_provisional(self, validate: bool) -> None:
        """On the way out: a stack still waiting for its validation pass gets it when ``validate`` and the budget
        allows; otherwise the program goes back to the last validated one. Its candidates are recorded either way
        (a stop callback asking again, at their verdicts, changes nothing: the run is ending)."""
        pending, self._provisional = self._provisional, None
        if pending is None:
            return
        self.budget.set_aside(0)
        self.state.instructions = pending.validated
        affordable = self.evaluator.cost(pending.program, self.valset) <= self.budget.remaining()
        if validate and pending.winners and affordable:
            try:
                self._validate_stack(pending)
            except (BudgetExhausted, StopRun) as stop:  # a cap or a callback: what was accepted before it stays
                logger.info("the last stack's validation did not finish: %s", stop)
        last = self.state.rounds[-1]
        last.best_val_score, last.metric_calls = self.state.best_val_score, self.budget.metric_calls
        try:
            self._record_all(last, [item.record for item in pending.checked])
        except StopRun:
            pass

    def _validate_alone(self, record: CandidateRecord) -> None:
        """A winner of its cluster on the current program, validated alone (after its stack lost)."""
        candidate = self.state.instructions.with_instruction(record.predictor, record.instruction)
        needed = self.evaluator.cost(candidate, self.valset)
        if needed > self.budget.remaining():
            raise BudgetExhausted(f"the next validation pass needs up to {needed} metric calls")
        start = self.budget.metric_calls
        if self.acceptance.validate(record, candidate):
            self._install(candidate)
        record.metric_calls += self.budget.metric_calls - start

    def _propose(
        self, cluster: Cluster, minimum: int, program: ProgramState
    ) -> tuple[CandidateRecord, ProgramState | None]:
        """The record for ``cluster`` rewritten on ``program``, and the candidate program (None when the
        rewrite cannot be judged; the record says why)."""
        state, name = self.state, cluster.predictor
        current = program[name]
        record = CandidateRecord(state.round_index, name, len(cluster.members), minimum, cluster.text, current, None)
        self._judging = record  # paid for from here: recorded even if the run stops before its verdict
        proposal = self.rewriter.rewrite(cluster, program)
        problem = self.rewriter.unusable(proposal, current, name)
        if proposal is not None and proposal.strip() != current.strip():
            record.instruction = proposal
        if problem is not None:
            record.reason = problem
            return record, None
        self.emit(
            "on_candidate_proposed",
            CandidateProposed(state.round_index, name, len(cluster.members), cluster.text, proposal),
        )
        return record, program.with_instruction(name, proposal)

    def update_demos(self, cluster: Cluster, minimum: int) -> CandidateRecord:
        """Step 5 for one cluster with demonstrations: the cluster's pseudo-labels shown to its predictor
        (no LM call; see :mod:`.demonstrations`), judged like a rewrite."""
        self.finish_validation()
        state, name = self.state, cluster.predictor
        record = CandidateRecord(
            state.round_index, name, len(cluster.members), minimum, cluster.text, state.instructions[name], None
        )
        record.kind = "demos"
        self._judging = record
        demos = added_demos(
            state.instructions.demos_of(name), [g.record for g in cluster.members], self.config.proposals.max_demos
        )
        if demos is None:
            record.reason = "no new demonstration (each pseudo-label leaks or is shown already)"
            return record
        self.acceptance.require_affordable(cluster)
        record.demos = demos
        shown = f"{len(demos)} demonstration(s): " + "; ".join(format_fields(d) for d in demos)
        self.emit(
            "on_candidate_proposed",
            CandidateProposed(state.round_index, name, len(cluster.members), cluster.text, shown),
        )
        self._judge(record, state.instructions.with_demos(name, demos), cluster)
        return record

    def _judge(self, record: CandidateRecord, candidate: ProgramState, cluster: Cluster) -> None:
        """Two-stage acceptance of one candidate on its cluster's examples (see :class:`Acceptance`); the
        current program becomes it when it wins."""
        start = self.budget.metric_calls
        self.acceptance.judge(record, candidate, [g.record.example for g in cluster.members])
        record.metric_calls = self.budget.metric_calls - start
        if record.accepted:
            self._install(candidate)

    def _install(self, candidate: ProgramState) -> None:
        """An accepted candidate becomes the current program."""
        self.state.instructions = candidate
        self.state.val_history.append((self.budget.metric_calls, self.state.best_val_score))

    # ---- the loop -----------------------------------------------------------------------------
    def run(self, max_rounds: int | None, resumed: bool = False) -> str:
        """Validate the starting program, then run rounds until a stop rule holds; returns the reason.

        Stops: ``max_rounds``; no failure left when the batch is the whole training set; a budget
        cap (the step that would exceed it is not started); a callback's :class:`StopRun`; as many rounds
        in a row without a metric call as the cluster schedule is long (nothing new was run or scored:
        nothing left to learn); Ctrl-C.

        The starting program's validation pass is needed first by the first candidate's check, so
        with several threads it runs beside the first round's attribution and proposals (sharing
        ``num_threads``), when the training and validation examples are distinct and no task-LM cap is set; its
        metric calls are set aside first (see :meth:`_start_validation`).
        """
        sizes, cap = (len(self.trainset), len(self.valset)), self.budget.max_metric_calls
        self.emit("on_run_start", RunStart(list(self.state.instructions), *sizes, cap, max_rounds, resumed))
        with ThreadPoolExecutor(max_workers=1) as background, shared_threads(self.config.execution.num_threads):
            try:
                self._start_validation(background)
                idle_rounds = 0
                while max_rounds is None or self.state.round_index < max_rounds:
                    spent = self.budget.metric_calls
                    record = self.run_round()
                    if self._no_failures_left(record):
                        self.state.stop_reason = "no failures left on the training set"
                        break
                    idle_rounds = idle_rounds + 1 if self.budget.metric_calls == spent else 0
                    if idle_rounds >= len(self.config.abstraction.cluster_schedule):
                        self.state.stop_reason = f"stalled: {idle_rounds} rounds without a metric call"
                        break
                else:
                    self.state.stop_reason = f"max_rounds={max_rounds} reached"
                self.finish_validation()
                self._settle_provisional(validate=True)
            except BudgetExhausted as stop:
                self.state.stop_reason = f"budget exhausted ({stop})"
                self._settle_validation()
                self._settle_provisional(validate=True)
            except StopRun as stop:
                self.state.stop_reason = str(stop)
                self._settle_validation()
                self._settle_provisional(validate=True)
            except KeyboardInterrupt:
                self.state.interrupted, self.state.stop_reason = True, "interrupted (KeyboardInterrupt)"
            finally:
                self._settle_validation()
                self._settle_provisional(validate=False)
                self.evaluator.drop_ahead()
        self.emit(
            "on_run_end",
            RunEnd(
                self.state.stop_reason,
                self.state.interrupted,
                self.state.initial_val_score,
                self.state.best_val_score,
                self.budget.metric_calls,
                self.state.round_index,
            ),
        )
        return self.state.stop_reason

    def _no_failures_left(self, record: RoundRecord) -> bool:
        """Whether the round found no failure on the whole training set under the program the run holds now (not
        under winners installed unvalidated that their pass then left out, nor before a candidate changed it)."""
        whole = record.failures == 0 and record.batch_size == len(self.trainset)
        return whole and self._attributed == self.state.instructions and self._provisional is None

    def _start_validation(self, background: ThreadPoolExecutor) -> None:
        """The starting program's validation pass: beside round 0 when that cannot change what either does.

        Its metric calls are set aside before round 0 starts, so round 0 has the budget it would have after the
        pass at one thread; under a task-LM cap (whose calls cannot be set aside) it runs first, as at one thread.
        """
        instructions = self.state.instructions
        cost = self.evaluator.cost(instructions, self.valset)

        def validate() -> list[Outcome]:
            with in_background(), self.budget.drawing_on(VALIDATION_PASS):
                return self.evaluator.evaluate(instructions, self.valset, "validate")

        train_keys = {example_key(ex) for ex in self.trainset}
        overlap = (
            self.config.execution.num_threads > 1
            and not self.budget.task_capped
            and cost <= self.budget.remaining()
            and not any(example_key(ex) in train_keys for ex in self.valset)
        )
        if overlap:
            self.budget.set_aside(cost, VALIDATION_PASS)
            self._validation = background.submit(contextvars.copy_context().run, validate)
        else:
            self._record_validation(validate())

    def finish_validation(self) -> None:
        """Wait for the starting program's validation pass when it runs beside the round (raising what it
        raised), and record it."""
        if self._validation is None:
            return
        outcomes, self._validation = self._validation.result(), None
        self._record_validation(outcomes)

    def _record_validation(self, outcomes: list[Outcome]) -> None:
        self.state.set_best(outcomes)
        self.state.initial_val_scores = list(self.state.best_val_scores)
        self.state.initial_val_objectives = dict(self.state.best_val_objectives)
        check_guarded_objectives(self.config.judging.objective_guards, self.state.initial_val_objectives)
        self.state.val_labels = [example_label(e) for e in self.valset]
        self.state.initial_val_score = self.state.best_val_score
        self.state.val_history.append((len(self.valset), self.state.best_val_score))
        self.emit(
            "on_validation_scored",
            ValidationScored(None, self.state.best_val_score, self.state.best_val_score, len(self.valset)),
        )

    def _settle_validation(self) -> None:
        """On the way out: record the validation pass if it was paid; a failure of it was already reported."""
        if self._validation is None:
            return
        try:
            self.finish_validation()
        except Exception as error:  # the run is stopping for another reason, told in stop_reason
            logger.info("the starting program's validation pass did not finish: %s", error)
            self._validation = None

    def run_round(self) -> RoundRecord:
        """One round; returns its record (also appended to ``self.state.rounds``)."""
        r = self.state.round_index
        self.evaluator.drop_ahead()  # runs made ahead in an earlier round that nothing asked for
        minimum = min_cluster_size(self.config.abstraction.cluster_schedule, r)
        batch = [self.trainset[i] for i in self.sampler.next()]
        self.emit("on_round_start", RoundStart(r, minimum, len(batch), self.budget.metric_calls))
        self._attributed = self.state.instructions
        attribution = self.attribute(batch)
        report = attribution.report
        failures = sum(o.score < self.config.scores.max_score for o in attribution.outcomes)
        self.emit("on_attribution", AttributionDone(r, report, failures, self.budget.metric_calls))
        self.state.blame += report.blame(r)
        fresh = self.abstraction.gradients(report, self.state.instructions, r)
        reflected = self._reflections(batch, attribution) if not fresh else []
        fresh += reflected
        fresh_keys = {(g.predictor, example_key(g.record.example)) for g in fresh}
        carried = [  # a gradient waits while its predictor's instruction is the one it was written against
            g
            for g in self.state.waiting
            if (g.predictor, example_key(g.record.example)) not in fresh_keys
            and r - g.round < len(self.config.abstraction.cluster_schedule)
            and g.instruction == self.state.instructions[g.predictor]
        ]
        ready, self.state.waiting = self.abstraction.abstract(fresh + carried, minimum, self.state.instructions)
        reverse_rank = {name: -i for i, name in enumerate(report.order)}
        ready.sort(key=lambda c: (-len(c.members), reverse_rank.get(c.predictor, 0)))
        record = RoundRecord(
            r,
            minimum,
            len(batch),
            failures,
            report.counts(),
            len(report.hard_cases),
            report.leaked,
            len(fresh),
            len(ready),
            len(self.state.waiting),
            explained_single=report.explained_single,
            explained_cumulative=report.explained_cumulative,
            placebo_withheld=report.placebo_withheld,
            reflected=len(reflected),
        )
        self.state.rounds.append(record)
        kinds = self.config.proposals.candidates
        if kinds != "demos":
            self.speculation.prefetch_rewrites(ready)
        if attribution.speculated and kinds == "instructions":  # the stack holds rewrites only
            self.finish_validation()  # the stacked checks run against the starting program's scores
            waits = self.config.judging.validate_together and self._stack_waits()
            self.speculation.prefetch_judging(ready, r, validation=not waits)
        judged: list[CandidateRecord] = []  # verdicts given together, kept even when the round stops half-way
        try:
            if kinds == "instructions" and self.config.judging.validate_together:
                if ready or self._provisional:
                    self.update_together(ready, minimum, judged)
            else:  # one at a time: each verdict is reported before the next candidate (a callback may stop the run)
                shown = (self.update_demos(pool, minimum) for pool in pooled(ready) if kinds != "instructions")
                for candidate in chain(shown, (self.update(cluster, minimum) for cluster in ready if kinds != "demos")):
                    self._judging = None
                    self._record_all(record, [candidate])
        finally:
            if self._judging is not None:  # the run stopped while this candidate was judged
                unfinished, self._judging = self._judging, None
                if not unfinished.accepted and not unfinished.reason:
                    unfinished.reason = "the run stopped before it was judged"
                judged.append(unfinished)
            record.stacked = [winner.predictor for winner in self._provisional.winners] if self._provisional else []
            record.best_val_score = self.state.best_val_score
            record.metric_calls = self.budget.metric_calls
            self._record_all(record, judged)
        self.state.round_index += 1
        self.emit("on_round_end", RoundEnd(record))
        return record

    def _reflections(self, batch: list[dspy.Example], attribution: Attribution) -> list[Gradient]:
        """Gradients from reflecting on the round's hard cases, when no failure gave a pseudo-label
        (``reflect_hard_cases``): without them such a round teaches nothing, and a run whose failures are all hard
        cases stalls with budget left. A hard case is reflected on once per instruction of each predictor."""
        hard = attribution.report.hard_cases
        if not (self.config.proposals.reflect_hard_cases and hard) or self.config.proposals.candidates == "demos":
            return []
        program, order = self.state.instructions, attribution.report.order
        outcomes = {id(example): outcome for example, outcome in zip(batch, attribution.outcomes)}
        keys = {(id(e), n): (example_key(e), n, program[n]) for e in hard for n in order}
        asked = [(e, n) for e in hard for n in order if keys[id(e), n] not in self.state.reflected]
        if not asked:
            return []
        gradients = self.abstraction.reflections(
            [(n, e, outcomes[id(e)]) for e, n in asked], order, program, self.state.round_index
        )
        self.state.reflected.update(keys[id(e), n] for e, n in asked)
        logger.info(
            "round %d: no failure could be attributed; reflecting on %d hard case(s) gave %d gradient(s)",
            self.state.round_index,
            len({id(e) for e, _ in asked}),
            len(gradients),
        )
        return gradients

    def _stack_waits(self) -> bool:
        """Whether this round's winners wait, unvalidated, for the next round's: the rounds are grouped in windows of
        ``stack_rounds`` (0-1, 2-3, ... with 2), and a window's winners share the pass at its last round. A fixed
        window bounds the passes as a window opened by each first winner would, with less waiting on average.

        The round after one whose pass did not keep every winner validates its own: a rewrite that wins its cluster
        and breaks other examples, left waiting, would also spoil the next round's attribution (its failures are
        hard cases on top of it), and where such rewrites keep coming that would repeat in every window."""
        if self._stack_lost_at is not None and self.state.round_index - self._stack_lost_at <= 1:
            return False
        return (self.state.round_index + 1) % self.config.judging.stack_rounds != 0

    def _record_all(self, round_record: RoundRecord, candidates: list[CandidateRecord]) -> None:
        """Keep judged candidates in the state and the round's counts, then report each (the log is an observer's).
        All are kept before any is reported, and a callback's :class:`StopRun` is raised once every one is reported:
        a verdict given is never missing from the result."""
        for candidate in candidates:
            self.state.candidates.append(candidate)
            round_record.candidates += 1
            round_record.accepted += candidate.accepted
        stop: StopRun | None = None
        for candidate in candidates:
            judged = CandidateJudged(candidate, self.state.best_val_score, self.budget.metric_calls)
            try:
                self.emit("on_candidate_accepted" if candidate.accepted else "on_candidate_rejected", judged)
            except StopRun as raised:
                stop = stop or raised
        if stop is not None:
            raise stop
