"""The AgentGrad round engine.

One round: failure set -> sequential intervention in reverse execution order ->
gradient per attributed failure -> semantic abstraction under the cyclic
minimum-cluster-size schedule -> candidates judged by the run's judge. The engine owns the
loop and applies its stop rules, and reports each step as a typed event (:mod:`dspy_agentgrad.core.events`);
the rules themselves (schedule, windows, when a run stops) are :class:`~dspy_agentgrad.core.round_rules.RoundRules`,
which the projection of a run's cost plays forward too.
Steps 1-2 are the :class:`~dspy_agentgrad.core.attribution.Attributor`'s; step 5's candidates come
from the sources (:mod:`dspy_agentgrad.core.sources`) and are judged by a
:class:`~dspy_agentgrad.core.judging.protocol.RoundJudge`. It makes no LM call itself: program runs
go through the :class:`Evaluator`, LM roles through the :class:`Proposer`.
"""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

import dspy

from ..config import AgentGradConfig
from ..program.evaluation import Evaluator
from ..program.program_state import ProgramState
from ..roles.proposer import Proposer
from ..runtime.budget import Budget, BudgetExhausted
from ..runtime.jsonable import example_key
from ..runtime.parallel import shared_threads
from .abstraction import Abstraction
from .attribution import Attribution, Attributor, HintFn
from .batches import BatchSampler
from .events import AttributionDone, Dispatcher, RoundEnd, RoundStart, RunEnd, RunStart, StopRun
from .idle_rounds import IdleRounds, Overdraft
from .judging import judge_for
from .judging.acceptance import Acceptance
from .judging.protocol import JudgingParts
from .judging.verdicts import Verdicts
from .rewriting import Rewriter
from .round_rules import RoundRules, judging_order
from .sources import sources_for
from .speculation import Speculation, speculation_helps
from .starting_validation import StartingValidation
from .state import CandidateRecord, RoundRecord, RunState


class RoundEngine:
    """The loop of rounds and its stop rules; each step is delegated to the part of the paper it is.

    It owns the run's :class:`RunState` and reports each step as an event. Steps 1-2 are the
    :class:`Attributor`'s, 3-4 the :class:`Abstraction`'s, step 5 the sources' and the judge's (deciding with
    :class:`Acceptance`); :class:`Speculation` decides what of what the steps may ask is done ahead.
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
        self.rules = RoundRules.of(config)
        self.rng = random.Random(config.execution.seed)
        self.sampler = BatchSampler(len(trainset), self.rules.batch_size(len(trainset)), self.rng)
        self.abstraction = Abstraction(config, proposer, signatures, self.rng)
        self.rewriter = Rewriter(config, proposer, signatures, state)
        self.verdicts = Verdicts(state, budget, self.emit)
        acceptance = Acceptance(config, evaluator, budget, valset, state, self.emit, self.verdicts)
        self.starting = StartingValidation(
            evaluator,
            budget,
            state,
            trainset,
            valset,
            self.emit,
            config.execution.num_threads,
            config.judging.objective_guards,
        )
        self.speculation = Speculation(
            config, evaluator, proposer, budget, valset, state, self.rewriter, acceptance, self.starting.finish
        )
        self.attributor = Attributor(config, evaluator, hint_fn, self.speculation)
        self.sources = sources_for(config, self.rewriter, self.abstraction, state, self.verdicts, self.emit)
        parts = JudgingParts(
            acceptance,
            self.verdicts,
            evaluator,
            budget,
            valset,
            state,
            self.starting.finish,
            config.judging.prune_rewrites,
        )
        self.judge = judge_for(self.rules, parts, self.sources)
        self._attributed: ProgramState | None = None  # the program the last round's failures were measured on
        self._budget_cut: str | None = None  # where a cap bound inside a round without stopping the run
        self._max_rounds: int | None = None  # the current run's

    def attribute(
        self, examples: list[dspy.Example], phase: str = "evaluate", revisits: set[int] | None = None
    ) -> Attribution:
        """Steps 1-2 for the current program: failure set and sequential intervention (see :class:`Attributor`)."""
        return self.attributor.attribute(self.state.instructions, examples, self.state.round_index, phase, revisits)

    # ---- the loop -----------------------------------------------------------------------------
    def run(self, max_rounds: int | None, resumed: bool = False) -> str:
        """Validate the starting program, then run rounds until a stop rule holds; returns the reason.

        Stops: ``max_rounds``; no failure left when the batch is the whole training set; a budget
        cap (the step that would exceed it is not started); a callback's :class:`StopRun`; as many rounds
        in a row that took nothing from the budget as the cluster schedule is long (:class:`IdleRounds`); past the
        budget in task spend, ``overdraft_rounds`` rounds in a row without a validation gain (:class:`Overdraft`);
        Ctrl-C.

        The starting program's validation pass is needed first by the first candidate's check, so
        with several threads it runs beside the first round's attribution and proposals (sharing
        ``num_threads``), when the training and validation examples are distinct and no task-LM cap is set; its
        metric calls are set aside first (see :class:`StartingValidation`).
        """
        self._max_rounds = max_rounds
        sizes, cap = (len(self.trainset), len(self.valset)), self.budget.max_metric_calls
        self.emit("on_run_start", RunStart(self.state.instructions.names, *sizes, cap, max_rounds, resumed))
        with ThreadPoolExecutor(max_workers=1) as background, shared_threads(self.config.execution.num_threads):
            try:
                self.starting.start(background)
                idle = IdleRounds(self.rules.cycle, self.budget.cap_task_spend)
                overdraft = Overdraft(self.config.budget.overdraft_rounds, self.budget.max_metric_calls)
                while max_rounds is None or self.state.round_index < max_rounds:
                    paid = self.budget.counted
                    record = self.run_round()
                    if self._no_failures_left(record):
                        self.state.stop_reason = "no failures left on the training set"
                        break
                    if idle.stops_after(self.budget.counted != paid):
                        self.state.stop_reason = idle.reason
                        break
                    if overdraft.stops_after(record.best_val_score, float(self.budget.task_spend)):
                        self.state.stop_reason = overdraft.reason
                        break
                else:
                    self.state.stop_reason = f"max_rounds={max_rounds} reached"
                self.starting.finish()
                self.judge.settle(validate=True)
            except BudgetExhausted as stop:
                self.state.stop_reason = f"budget exhausted ({stop})"
                self.starting.settle()
                self.judge.settle(validate=True, stopped=True)
            except StopRun as stop:
                self.state.stop_reason = str(stop)
                self.starting.settle()
                self.judge.settle(validate=True, stopped=True)
            except KeyboardInterrupt:
                self.state.interrupted, self.state.stop_reason = True, "interrupted (KeyboardInterrupt)"
            finally:
                self.starting.settle()
                self.judge.settle(validate=False)
                self.speculation.drop()
        if self._budget_cut is not None and not self.state.stop_reason.startswith("budget exhausted"):
            self.state.stop_reason += f"; {self._budget_cut}"  # the result says where a cap bound
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
        whole = self.rules.no_failure_left(record.failures, record.batch_size, len(self.trainset))
        return whole and self._attributed == self.state.instructions and not self.judge.waiting()

    def _revisits(self, indices: list[int]) -> set[int]:
        """The positions in this round's batch whose failures count as revisited (``cumulative_hints="revisits"``):
        those of examples an earlier batch held, and every one in the last round ``max_rounds`` allows, after which
        no example comes back."""
        last = self._max_rounds is not None and self.state.round_index + 1 >= self._max_rounds
        return set(range(len(indices))) if last else self.sampler.revisited(indices)

    def run_round(self) -> RoundRecord:
        """One round; returns its record (also appended to ``self.state.rounds``)."""
        r = self.state.round_index
        self.speculation.start_round()
        minimum = self.rules.minimum(r)
        indices = self.sampler.next()
        batch = [self.trainset[i] for i in indices]
        self.emit("on_round_start", RoundStart(r, minimum, len(batch), self.budget.metric_calls))
        self._attributed = self.state.instructions
        attribution = self.attribute(batch, revisits=self._revisits(indices))
        report = attribution.report
        if attribution.budget_stop is not None:
            self._budget_cut = f"a cap ended round {r}'s cumulative intervention early ({attribution.budget_stop})"
        failures = attribution.failures
        self.emit("on_attribution", AttributionDone(r, report, failures, self.budget.metric_calls))
        self.state.blame += report.blame(r)
        fresh = self.abstraction.gradients(report, self.state.instructions, r)
        reflected = self.sources.reflect(batch, attribution) if not fresh else []
        fresh += reflected
        fresh_keys = {(g.predictor, example_key(g.record.example)) for g in fresh}
        carried = [  # a gradient waits while its predictor's instruction is the one it was written against
            g
            for g in self.state.waiting
            if (g.predictor, example_key(g.record.example)) not in fresh_keys
            and self.rules.still_waits(g.round, r)
            and g.instruction == self.state.instructions.instruction(g.predictor)
        ]
        ready, self.state.waiting = self.abstraction.abstract(fresh + carried, minimum, self.state.instructions)
        ready = judging_order(ready, report.order)
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
            cumulative_deferred=report.cumulative_deferred,
            reflected=len(reflected),
        )
        self.state.rounds.append(record)
        self.speculation.before_judging(ready, self.judge.validates_this_round())
        judged: list[CandidateRecord] = []  # verdicts given together, kept even when the round stops half-way
        try:
            self.judge.judge_round(ready, minimum, record, judged)
        finally:
            judged += self.verdicts.unfinished()  # the run stopped while this candidate was judged
            record.stacked = [winner.predictor for winner in self.judge.waiting()]
            record.best_val_score = self.state.best_val_score
            record.metric_calls = self.budget.metric_calls
            self.verdicts.record(record, judged)
        self.state.round_index += 1
        self.emit("on_round_end", RoundEnd(record))
        return record
