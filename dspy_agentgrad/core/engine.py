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
from .speculation import Speculation
from .state import CandidateRecord, Cluster, Gradient, RoundRecord, RunState, example_label

logger = logging.getLogger("dspy.agentgrad")


class BatchSampler:
    """Epoch-shuffled training batches, reproducible from the seed."""

    def __init__(self, size: int, batch_size: int, rng: random.Random):
        self.size, self.batch_size, self.rng = size, min(batch_size, size), rng
        self.queue: list[int] = []

    def next(self) -> list[int]:
        """The next training batch: every example once per epoch before any repeats."""
        batch: list[int] = []
        while len(batch) < self.batch_size:
            if not self.queue:
                self.queue = list(range(self.size))
                self.rng.shuffle(self.queue)
            index = self.queue.pop(0)
            if index not in batch:
                batch.append(index)
        return batch


@dataclass
class Held:
    """A candidate that lost its cluster check on top of unvalidated winners (``behind``): if one of them is not
    kept, the check stood on a program that will not exist, and the candidate is judged again."""

    record: CandidateRecord
    cluster: Cluster
    behind: list[CandidateRecord]


@dataclass
class Provisional:
    """Winners installed but not validated yet (``stack_rounds``): ``validated`` is the program they build on (the
    best one validated); ``held``: the candidates that lost their cluster check on top of them."""

    validated: ProgramState
    winners: list[CandidateRecord]
    held: list[Held]

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
        self.config = config
        self.evaluator = evaluator
        self.budget = budget
        self.state = state
        self.trainset = trainset
        self.valset = valset
        self.emit = emit or Dispatcher()
        self.rng = random.Random(config.seed)
        self.sampler = BatchSampler(len(trainset), config.train_batch_size, self.rng)
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

    def update_together(self, ready: list[Cluster], minimum: int) -> list[CandidateRecord]:
        """Step 5 for the round's clusters, the winners validated together (``validate_together``).

        Each rewrite is made on top of the round's earlier winners and must beat that stack on its own
        cluster (as it would after their acceptance); the stack of winners then takes one validation
        pass instead of one per candidate. When the stack does not beat the best program, each winner is
        validated alone on the current program, in order, as :meth:`update` would. When it wins but loses
        examples the best program had, a winner that gives less than it costs is found and dropped
        (:meth:`_drop_harmful`), so a harmful rewrite cannot ride along either way; a candidate that lost its
        cluster check on top of a winner that is not kept is judged again (:meth:`_judge_again`). When every
        candidate wins and is accepted, the decisions are :meth:`update`'s, for one validation pass instead of
        one per candidate.

        With ``stack_rounds`` above 1 the stack spans a window of that many rounds: until the window's last round,
        its winners stay installed unvalidated (:class:`Provisional`), the next round attributes and rewrites on
        top of them, and they are returned with the round that validates them.
        """
        self.finish_validation()
        pending = self._provisional
        self.budget.set_aside(0)  # the checks below keep a validation pass affordable
        program, records = self.state.instructions, []
        winners, held = (list(pending.winners), list(pending.held)) if pending else ([], [])
        for cluster in ready:
            if not self.acceptance.affordable(program, cluster):  # its checks and one validation pass
                if not records and pending is None:
                    self.acceptance.require_affordable(cluster)
                break  # the stack so far still gets its validation pass
            record, candidate = self._propose(cluster, minimum, program)
            records.append(record)
            if candidate is None:
                continue
            start = self.budget.metric_calls
            won = self.acceptance.cluster_check(record, program, candidate, [g.record.example for g in cluster.members])
            record.metric_calls = self.budget.metric_calls - start
            if won:
                winners.append(record)
                program = candidate
            elif winners:
                held.append(Held(record, cluster, list(winners)))
        if not winners:
            return records
        base = pending.validated if pending else self.state.instructions
        needed = self.evaluator.cost(program, self.valset)
        if self._stack_waits() and needed <= self.budget.remaining():  # waits for the next round's winners
            self._provisional, self.state.instructions = Provisional(base, winners, held), program
            self.budget.set_aside(needed)  # its validation pass stays paid for
            waiting = {id(record) for record in winners} | {id(h.record) for h in held}
            return [record for record in records if id(record) not in waiting]
        self._provisional = None
        self._validate_stack(base, program, winners)
        self._judge_again(held)
        if not all(winner.accepted for winner in winners):
            self._stack_lost_at = self.state.round_index
        if not pending:
            return records
        earlier = {id(h.record) for h in pending.held}
        return winners[: len(pending.winners)] + [h.record for h in held if id(h.record) in earlier] + records

    def _judge_again(self, held: list[Held]) -> None:
        """Judge again, on the program now validated, each candidate whose lost cluster check stood on a winner that
        was not kept (:class:`Held`): a harmful rewrite must not also block the ones checked after it."""
        for item in held:
            if all(winner.accepted for winner in item.behind):
                continue
            record = item.record
            if not self.acceptance.affordable(self.state.instructions, item.cluster):
                record.reason += "; not judged again without the winner it stood on: no budget left"
                continue
            record.cluster_score_before = record.cluster_score_after = None
            paid = record.metric_calls
            self._judge(
                record, self.state.instructions.with_instruction(record.predictor, record.instruction), item.cluster
            )
            record.metric_calls += paid
            record.reason += " (judged again without a winner that was not kept)"

    def _validate_stack(self, base: ProgramState, program: ProgramState, winners: list[CandidateRecord]) -> None:
        """One validation pass for the stack of ``winners`` (``program``, built on the validated ``base``); when it
        loses, each winner is validated alone on ``base``, in order."""
        self.state.instructions = base
        before = list(self.state.best_val_scores)
        start, last = self.budget.metric_calls, winners[-1]
        together = self.acceptance.validate(last, program)
        last.metric_calls += self.budget.metric_calls - start
        if together:
            for record in winners:
                record.accepted, record.val_score, record.validated_at = True, last.val_score, last.validated_at
                if len(winners) > 1:
                    record.reason = f"{last.reason}, validated with {len(winners) - 1} other winner(s)"
            self._install(program)
            self._drop_harmful(base, winners, before)
            return
        if len(winners) > 1:
            logger.info("round %d: the stack of %d winners lost on validation", self.state.round_index, len(winners))
            for record in winners:
                self._validate_alone(record)

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
        allows; otherwise the program goes back to the last validated one. Its winners are recorded either way (a
        stop callback asking again, at their verdicts, changes nothing: the run is ending)."""
        pending, self._provisional = self._provisional, None
        if pending is None:
            return
        self.budget.set_aside(0)
        self.state.instructions, checked = pending.validated, False
        if validate and self.evaluator.cost(pending.program, self.valset) <= self.budget.remaining():
            try:
                self._validate_stack(pending.validated, pending.program, pending.winners)
                checked = True
            except BudgetExhausted as stop:  # a task-LM cap: what was accepted before it stays
                logger.info("the last stack's validation did not finish: %s", stop)
        if checked:
            self._judge_again(pending.held)
        for record in pending.winners:
            if not checked and not record.accepted:
                record.reason = "won its cluster; the run stopped before its stack's validation pass"
        for record in pending.winners + [h.record for h in pending.held]:
            try:
                self._record(self.state.rounds[-1], record)
            except StopRun:
                pass

    def _validate_alone(self, record: CandidateRecord) -> None:
        """A winner of its cluster validated on the current program (after its stack lost)."""
        candidate = self.state.instructions.with_instruction(record.predictor, record.instruction)
        needed = self.evaluator.cost(candidate, self.valset)
        if needed > self.budget.remaining():
            raise BudgetExhausted(f"the next validation pass needs up to {needed} metric calls")
        start = self.budget.metric_calls
        record.accepted, record.val_score, record.validated_at = False, None, None
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
        demos = added_demos(
            state.instructions.demos_of(name), [g.record for g in cluster.members], self.config.max_demos
        )
        if demos is None:
            record.reason = "no new demonstration (each pseudo-label leaks or is shown already)"
            return record
        self.acceptance.require_affordable(cluster)
        record.demos = demos
        shown = f"{len(demos)} demonstration(s): " + "; ".join(
            format_fields(d, self.config.max_field_chars) for d in demos
        )
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
        ``num_threads``), when the training and validation examples are distinct.
        """
        sizes, cap = (len(self.trainset), len(self.valset)), self.budget.max_metric_calls
        self.emit("on_run_start", RunStart(list(self.state.instructions), *sizes, cap, max_rounds, resumed))
        with ThreadPoolExecutor(max_workers=1) as background, shared_threads(self.config.num_threads):
            try:
                self._start_validation(background)
                idle_rounds = 0
                while max_rounds is None or self.state.round_index < max_rounds:
                    spent = self.budget.metric_calls
                    record = self.run_round()
                    if record.failures == 0 and record.batch_size == len(self.trainset):
                        self.state.stop_reason = "no failures left on the training set"
                        break
                    idle_rounds = idle_rounds + 1 if self.budget.metric_calls == spent else 0
                    if idle_rounds >= len(self.config.cluster_schedule):
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

    def _start_validation(self, background: ThreadPoolExecutor) -> None:
        instructions = self.state.instructions

        def validate() -> list[Outcome]:
            with in_background():
                return self.evaluator.evaluate(instructions, self.valset, "validate")

        train_keys = {example_key(ex) for ex in self.trainset}
        overlap = (
            self.config.num_threads > 1
            and self.evaluator.cost(instructions, self.valset) <= self.budget.remaining()
            and not any(example_key(ex) in train_keys for ex in self.valset)
        )
        if overlap:
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
        check_guarded_objectives(self.config.objective_guards, self.state.initial_val_objectives)
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
        minimum = min_cluster_size(self.config.cluster_schedule, r)
        batch = [self.trainset[i] for i in self.sampler.next()]
        self.emit("on_round_start", RoundStart(r, minimum, len(batch), self.budget.metric_calls))
        attribution = self.attribute(batch)
        report = attribution.report
        failures = sum(o.score < self.config.max_score for o in attribution.outcomes)
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
            and r - g.round < len(self.config.cluster_schedule)
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
        kinds = self.config.candidates
        if kinds != "demos":
            self.speculation.prefetch_rewrites(ready)
        if attribution.speculated and kinds == "instructions":  # the stack holds rewrites only
            self.finish_validation()  # the stacked checks run against the starting program's scores
            waits = self.config.validate_together and self._stack_waits()
            self.speculation.prefetch_judging(ready, r, validation=not waits)
        if kinds == "instructions" and self.config.validate_together:
            judged = self.update_together(ready, minimum) if ready or self._provisional else []
        else:  # with "both", the rewrites build on the demonstrations kept
            shown = (self.update_demos(pool, minimum) for pool in pooled(ready) if kinds != "instructions")
            judged = chain(shown, (self.update(cluster, minimum) for cluster in ready if kinds != "demos"))
        for candidate in judged:
            self._record(record, candidate)
        record.stacked = [winner.predictor for winner in self._provisional.winners] if self._provisional else []
        record.best_val_score = self.state.best_val_score
        record.metric_calls = self.budget.metric_calls
        self.state.round_index += 1
        self.emit("on_round_end", RoundEnd(record))
        return record

    def _reflections(self, batch: list[dspy.Example], attribution: Attribution) -> list[Gradient]:
        """Gradients from reflecting on the round's hard cases, when no failure gave a pseudo-label
        (``reflect_hard_cases``): without them such a round teaches nothing, and a run whose failures are all hard
        cases stalls with budget left. A hard case is reflected on once per instruction of each predictor."""
        hard = attribution.report.hard_cases
        if not (self.config.reflect_hard_cases and hard) or self.config.candidates == "demos":
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
        return (self.state.round_index + 1) % self.config.stack_rounds != 0

    def _record(self, round_record: RoundRecord, candidate: CandidateRecord) -> None:
        """Keep a judged candidate in the state and the round's counts; report it (the log is an observer's)."""
        self.state.candidates.append(candidate)
        round_record.candidates += 1
        round_record.accepted += candidate.accepted
        judged = CandidateJudged(candidate, self.state.best_val_score, self.budget.metric_calls)
        self.emit("on_candidate_accepted" if candidate.accepted else "on_candidate_rejected", judged)
