"""Scored program runs with budget, caching, replay of paid results, and usage accounting.

Every scored run is one metric call. A run is keyed by what determines it (the
instructions, the example, and for an intervention the hinted predictor and the
hint); a key seen before in this run is free, a key first seen in this run is
charged once, whether it is computed now or replayed from ``log_dir`` after a
resume. That makes a resumed run spend exactly what the uninterrupted run spends.

With ``reuse`` on, each run names a reference (:class:`runs.Reference`): for a plain
run, the earlier run of the same example whose instructions differ in the fewest
predictors; for an intervention, the run it intervenes on. A run whose program output
equals its reference's takes that score without a metric call. Every run, scored or not, also
counts the share of its calls it made anew (:attr:`.runs.Outcome.task_share`) toward the budget's
task spend. References are chosen from batches already settled, in request order, so the choice,
the metric calls and the task spend are the same at any thread count and after a resume.

Speculation runs programs ahead (:meth:`Evaluator.run_chains_ahead`, :meth:`Evaluator.intervene_ahead`)
without scoring them, into :class:`.ahead.RunsAhead`, which the evaluator consults before it makes a run: a
run made ahead is scored, and charged, only when the sequential procedure asks for it, so the metric calls
and the decisions are those of the procedure without speculation, under any budget.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import dspy

from ..runtime.budget import Budget, TaskCapReached
from ..runtime.jsonable import digest, example_key
from ..runtime.paid_work import PaidWork
from ..runtime.parallel import parallel_map
from ..runtime.store import Memo
from ..runtime.usage import UsageLedger
from .ahead import RunsAhead
from .executor import Runs
from .program_state import ProgramState
from .runner import check_first_runs
from .runs import Execution, Outcome, Reference, Step

#: Earlier plain runs kept per example as candidate references.
REFERENCES_KEPT = 6


@dataclass
class Intervention:
    """Re-run ``example`` with ``hints`` (predictor name -> hint) given to every call of those
        predictors; the calls in ``replay`` (of predictors that ran before them) are replayed.
        ``original`` is the run whose calls and score are reused (same instructions; by default the run
        intervened on, with no hints); ``differs`` names the predictors besides the hinted ones whose calls
        may differ from it (those hinted there). ``only``: a predictor whose hint reaches only some of its calls
    (the calls with that :func:`.run_control.call_key`): to find which of several calls a hint fixed."""

    example: dspy.Example
    hints: dict[str, str]
    replay: list[Step]
    original: Outcome | None = None
    differs: frozenset[str] = frozenset()
    only: dict[str, str] = field(default_factory=dict)  # hinted predictor -> call key of the calls its hint reaches


def _changed(instructions: ProgramState, other: ProgramState) -> frozenset[str]:
    """The predictors whose instruction or added demonstrations differ between two programs."""
    return instructions.changed(other)


def _chain_keys(chains: list[tuple[dspy.Example, list[ProgramState]]]) -> tuple[dict[int, str], list[str]]:
    """Each program's state key (by object: the chains hold them alive) and every run's key, in order."""
    digests = {id(state): state_key(state) for _, states in chains for state in states}
    return digests, [eval_key(digests[id(state)], ex) for ex, states in chains for state in states]


def state_key(instructions: ProgramState | Mapping[str, str]) -> str:
    """The key of a program (:meth:`ProgramState.key`): runs under equal programs are the same paid work. A plain
    mapping of instructions, or a program without added demonstrations, keys as it did before they existed."""
    return ProgramState.of(instructions).key()


def eval_key(state: str, example: dspy.Example) -> str:
    """The cache key of a plain scored run: the program's :func:`state_key` and the example."""
    return f"eval:{state}:{example_key(example)}"


class Evaluator:
    """Scored program runs, each one metric call, charged before they start."""

    def __init__(
        self,
        runner: Runs,
        memo: Memo,
        budget: Budget,
        ledger: UsageLedger,
        num_threads: int = 1,
        reuse: bool = True,
    ):
        self.runner = runner
        self.work: PaidWork[Outcome] = PaidWork(
            memo, Outcome.to_dict, Outcome.from_dict, lambda outcome: budget.charge_replayed_task(outcome.usage)
        )
        self.budget = budget
        self.ledger = ledger
        self.num_threads = num_threads
        self.reuse = reuse
        self.reused = 0  # runs that took their reference's score instead of a metric call
        self.errors: Counter[str] = Counter()
        self.phase_calls: Counter[str] = Counter()  # metric calls made per phase
        self.phase_wall: Counter[str] = Counter()  # seconds spent waiting on runs per phase
        self._history: dict[str, list[tuple[ProgramState, Outcome]]] = {}
        self._lock = threading.Lock()
        self.ahead = RunsAhead(self.work, budget, ledger, self.errors, self._lock)  # runs made ahead of their scoring
        self._first_runs_checked = False

    def evaluate(
        self, instructions: ProgramState | Mapping[str, str], examples: list[dspy.Example], phase: str
    ) -> list[Outcome]:
        """Scored runs of ``examples`` under ``instructions``; the first call also checks the program runs at all."""
        outcomes = self.evaluate_many([(instructions, examples)], phase)[0]
        if not self._first_runs_checked:
            self._first_runs_checked = True
            check_first_runs(outcomes, self.runner.metric.called_as)
        return outcomes

    def evaluate_many(
        self, requests: list[tuple[ProgramState | Mapping[str, str], list[dspy.Example]]], phase: str
    ) -> list[list[Outcome]]:
        """Several (instructions, examples) evaluations as one batch: one charge, one parallel map."""
        plain = [(ProgramState.of(instructions), ex) for instructions, examples in requests for ex in examples]
        states = [state_key(instructions) for instructions, _ in requests]  # one digest per program
        keys = [eval_key(sk, ex) for sk, (_, examples) in zip(states, requests) for ex in examples]

        def pay_for(i: int) -> Callable[[], Outcome]:
            instructions, ex = plain[i]
            reference = self._reference(instructions, ex)
            return self._scored(
                keys[i], ex, reference, lambda: self.runner.execute(ex, instructions, reference=reference)
            )

        flat = self._run(keys, pay_for, phase)
        if self.reuse:
            for (instructions, ex), outcome in zip(plain, flat):
                self._remember(instructions, ex, outcome)
        out, start = [], 0
        for _instructions, examples in requests:
            out.append(flat[start : start + len(examples)])
            start += len(examples)
        return out

    def chain_cost(self, chains: list[tuple[dspy.Example, list[ProgramState]]]) -> int:
        """Program runs :meth:`run_chains_ahead` would make now for ``chains`` (none is a metric call)."""
        return len(self.ahead.not_run(_chain_keys(chains)[1]))

    def run_chains_ahead(self, chains: list[tuple[dspy.Example, list[ProgramState]]]) -> None:
        """Run, for each example, the program under a sequence of programs, in order, ahead of their scoring.

        Each program of a sequence differs from the one before it by a few instructions, and its
        run takes the run before it as reference (the first, the kept run with the fewest
        changes): so a call the change leaves as it was is not sent to the LM again. Nothing is
        scored or charged here: a later evaluation that asks for one of these runs scores it then,
        in the order and under the budget of the sequential procedure (:meth:`_scored`).
        """
        digests, keys = _chain_keys(chains)
        wanted = self.ahead.to_run(keys)

        def run_chain(chain: tuple[dspy.Example, list[ProgramState]]) -> None:
            example, states = chain
            previous: Execution | None = None
            for k, state in enumerate(states):
                key = eval_key(digests[id(state)], example)
                known = self.ahead.get(key)
                if known is None and key not in wanted:
                    previous = None  # scored already (or run by another chain): its run is not at hand
                    continue
                reference = previous.as_reference(_changed(state, states[k - 1])) if previous and self.reuse else None
                if reference is None:
                    reference = self._reference(state, example)
                if known is None:
                    known = self.runner.execute(example, state, reference=reference)
                    self.ahead.keep(key, known)
                previous = known

        parallel_map(run_chain, chains, self.num_threads)

    def intervene_ahead(self, instructions: ProgramState, items: list[Intervention]) -> None:
        """Make the hinted runs ``items`` ahead of their scoring (see :meth:`run_chains_ahead`)."""
        keys, execute = self._interventions(instructions, items)
        first: dict[str, int] = {}
        for i, key in enumerate(keys):
            first.setdefault(key, i)
        wanted = self.ahead.to_run(keys)
        todo = [(key, i) for key, i in first.items() if key in wanted]

        def run(job: tuple[str, int]) -> None:
            self.ahead.keep(job[0], execute(job[1]))

        parallel_map(run, todo, self.num_threads)

    def _scored(
        self, key: str, example: dspy.Example, reference: Reference | None, execute: Callable[[], Execution]
    ) -> Callable[[], Outcome]:
        """The work that settles ``key``: score the run made ahead for it, or make the run now and score it."""

        def pay() -> Outcome:
            execution = self.ahead.take(key)
            return self.runner.score(example, execute() if execution is None else execution, reference)

        return pay

    def intervene(
        self, instructions: ProgramState, items: list[Intervention], phase: str = "intervene"
    ) -> list[Outcome]:
        keys, execute = self._interventions(instructions, items)

        def pay_for(i: int) -> Callable[[], Outcome]:
            return self._scored(keys[i], items[i].example, self._intervention_reference(items[i]), lambda: execute(i))

        return self._run(keys, pay_for, phase)

    def _interventions(
        self, instructions: ProgramState, items: list[Intervention]
    ) -> tuple[list[str], Callable[[int], Execution]]:
        """The keys of hinted runs, and the program run of ``items[i]`` (not scored)."""
        sk = state_key(instructions)
        keys = [
            f"hint:{sk}:{example_key(it.example)}:{digest(it.hints)}" + (f":{digest(it.only)}" if it.only else "")
            for it in items
        ]

        def execute(i: int) -> Execution:
            it = items[i]
            reference = self._intervention_reference(it)
            return self.runner.execute(
                it.example, instructions, hints=it.hints, replay=it.replay, reference=reference, only=it.only
            )

        return keys, execute

    def _intervention_reference(self, item: Intervention) -> Reference | None:
        """A hinted run reuses the run it intervenes on, when that run did not fail."""
        if self.reuse and item.original is not None and item.original.error is None:
            return Reference(item.original, frozenset(item.hints) | item.differs)
        return None

    def _reference(self, instructions: ProgramState, example: dspy.Example) -> Reference | None:
        """The kept run of ``example`` whose instructions differ from ``instructions`` in the fewest
        predictors (the latest among equals), with those predictors; None when reuse is off or none is kept."""
        best: Reference | None = None
        for kept, outcome in self._history.get(example_key(example), []) if self.reuse else []:
            changed = _changed(instructions, kept)
            if best is None or len(changed) <= len(best.changed):
                best = Reference(outcome, changed)
        return best

    def _remember(self, instructions: ProgramState, example: dspy.Example, outcome: Outcome) -> None:
        if outcome.error is not None:
            return
        kept = self._history.setdefault(example_key(example), [])
        if any(ins == instructions for ins, _ in kept):
            return
        kept.append((instructions, outcome))
        del kept[:-REFERENCES_KEPT]

    def cost(self, instructions: ProgramState | Mapping[str, str], examples: list[dspy.Example]) -> int:
        """Metric calls that evaluating ``examples`` under ``instructions`` would charge now."""
        sk = state_key(instructions)
        return len(self.work.pending(eval_key(sk, ex) for ex in examples))

    def _run(self, keys: list[str], pay_for: Callable[[int], Callable[[], Outcome]], phase: str) -> list[Outcome]:
        """The outcomes for ``keys``: the new ones charged, then paid in parallel. ``pay_for(i)`` gives
        the work for ``keys[i]``; it is built (references chosen) now, in this thread, for new keys only."""
        fresh = self.work.pending(keys)
        self.budget.charge(len(fresh))
        started = time.perf_counter()
        first = {}
        for i, key in enumerate(keys):
            first.setdefault(key, i)
        work = {key: pay_for(first[key]) for key in fresh}

        def pay(key: str) -> Callable[[], Outcome]:  # a key settled elsewhere needs work only if that failed
            return work.get(key) or (lambda: pay_for(first[key])())

        parallel_map(lambda key: self._settle(key, pay(key), phase), fresh, self.num_threads)
        outcomes = [self._settle(key, pay(key), phase) for key in keys]
        self._timed(phase, started)
        return outcomes

    def _timed(self, phase: str, started: float) -> None:
        """Add the seconds since ``started`` to ``phase`` (where the wall goes; overlapping phases both count)."""
        with self._lock:
            self.phase_wall[phase] += time.perf_counter() - started

    def _settle(self, key: str, pay: Callable[[], Outcome], phase: str) -> Outcome:
        """The outcome for ``key`` (charged beforehand by the caller): paid once, counted once. A run the
        task-LM caps cut short is dropped: no metric call was made, its charge is given back."""
        try:
            outcome, new = self.work.settle(key, pay)
        except TaskCapReached:
            self.budget.refund(1)
            raise
        if new:
            self._count(outcome, phase)
            self.budget.settle_run(outcome.scored, outcome.task_share)
            if not outcome.scored:  # its output equals its reference's: no metric call was made
                with self._lock:
                    self.reused += 1
        return outcome

    def _count(self, outcome: Outcome, phase: str) -> None:
        self.ledger.add("task", phase, outcome.usage)
        with self._lock:
            self.phase_calls[phase] += outcome.scored
            if outcome.attempts > 1:
                self.errors["retries"] += outcome.attempts - 1
            if outcome.error:
                self.errors[outcome.error.split(":")[0]] += 1
                self.errors[outcome.error] += 1
