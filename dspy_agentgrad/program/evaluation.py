"""Scored program runs with budget, caching, replay of paid results, and usage accounting.

Every scored run is one metric call. A run is keyed by what determines it (the
instructions, the example, and for an intervention the hinted predictor and the
hint); a key seen before in this run is free, a key first seen in this run is
charged once, whether it is computed now or replayed from ``log_dir`` after a
resume. That makes a resumed run spend exactly what the uninterrupted run spends.

With ``reuse`` on, each run names a reference (:class:`tracing.Reference`): for a plain
run, the earlier run of the same example whose instructions differ in the fewest
predictors; for an intervention, the run it intervenes on. A run whose program output
equals its reference's takes that score without a metric call, and its charge is given
back. References are chosen from batches already settled, in request order, so the
choice and the metric calls are the same at any thread count and after a resume.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import dspy

from ..runtime.budget import Budget
from ..runtime.jsonable import digest, example_key
from ..runtime.paid_work import PaidWork
from ..runtime.parallel import parallel_map
from ..runtime.store import Memo
from ..runtime.usage import UsageLedger
from .program_state import ProgramState
from .runs import Outcome, Reference, Step
from .tracing import ProgramRunner, check_first_runs

#: Earlier plain runs kept per example as candidate references.
REFERENCES_KEPT = 6


@dataclass
class Intervention:
    """Re-run ``example`` with ``hints`` (predictor name -> hint) given to every call of those
    predictors; the calls in ``replay`` (of predictors that ran before them) are replayed.
    ``original`` is the run intervened on (same instructions, no hints)."""

    example: dspy.Example
    hints: dict[str, str]
    replay: list[Step]
    original: Outcome | None = None


def _changed(instructions: Mapping[str, str], other: Mapping[str, str]) -> frozenset[str]:
    """The predictors whose instruction or added demonstrations differ between two programs."""
    return ProgramState.of(instructions).changed(other)


def _chain_keys(chains: list[tuple[dspy.Example, list[dict[str, str]]]]) -> tuple[dict[int, str], list[str]]:
    """Each program's state key (by object: the chains hold them alive) and every run's key, in order."""
    digests = {id(state): state_key(state) for _, states in chains for state in states}
    return digests, [eval_key(digests[id(state)], ex) for ex, states in chains for state in states]


def state_key(instructions: Mapping[str, str]) -> str:
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
        runner: ProgramRunner,
        memo: Memo,
        budget: Budget,
        ledger: UsageLedger,
        num_threads: int = 1,
        reuse: bool = True,
    ):
        self.runner = runner
        self.work: PaidWork[Outcome] = PaidWork(memo, Outcome.to_dict, Outcome.from_dict)
        self.budget = budget
        self.ledger = ledger
        self.num_threads = num_threads
        self.reuse = reuse
        self.reused = 0  # runs that took their reference's score instead of a metric call
        self.errors: Counter[str] = Counter()
        self._history: dict[str, list[tuple[dict[str, str], Outcome]]] = {}
        self._lock = threading.Lock()
        self._first_runs_checked = False

    def evaluate(self, instructions: dict[str, str], examples: list[dspy.Example], phase: str) -> list[Outcome]:
        """Scored runs of ``examples`` under ``instructions``; the first call also checks the program runs at all."""
        outcomes = self.evaluate_many([(instructions, examples)], phase)[0]
        if not self._first_runs_checked:
            self._first_runs_checked = True
            check_first_runs(outcomes)
        return outcomes

    def evaluate_many(
        self, requests: list[tuple[dict[str, str], list[dspy.Example]]], phase: str
    ) -> list[list[Outcome]]:
        """Several (instructions, examples) evaluations as one batch: one charge, one parallel map."""
        plain = [(instructions, ex) for instructions, examples in requests for ex in examples]
        states = [state_key(instructions) for instructions, _ in requests]  # one digest per program
        keys = [eval_key(sk, ex) for sk, (_, examples) in zip(states, requests) for ex in examples]

        def pay_for(i: int) -> Callable[[], Outcome]:
            instructions, ex = plain[i]
            reference = self._reference(instructions, ex)
            return lambda: self.runner.run(ex, instructions, reference=reference)

        flat = self._run(keys, pay_for, phase)
        if self.reuse:
            for (instructions, ex), outcome in zip(plain, flat):
                self._remember(instructions, ex, outcome)
        out, start = [], 0
        for _instructions, examples in requests:
            out.append(flat[start : start + len(examples)])
            start += len(examples)
        return out

    def chain_cost(self, chains: list[tuple[dspy.Example, list[dict[str, str]]]]) -> int:
        """Metric calls :meth:`evaluate_chains` would charge now for ``chains`` (before any refund)."""
        return len(self.work.pending(_chain_keys(chains)[1]))

    def evaluate_chains(self, chains: list[tuple[dspy.Example, list[dict[str, str]]]], phase: str) -> None:
        """Settle, for each example, its runs under a sequence of programs, in order.

        Each program of a sequence differs from the one before it by a few instructions, and its
        run takes the run before it as reference (the first, the kept run with the fewest
        changes): so a run whose output the change leaves as it was is reused, as it would be if
        the programs were evaluated one after the other. Results are settled as paid work (later
        evaluations read them) and kept as references, in chain order, once all are done.
        """
        digests, keys = _chain_keys(chains)
        self.budget.charge(len(self.work.pending(keys)))

        def run_chain(chain: tuple[dspy.Example, list[dict[str, str]]]) -> list[Outcome]:
            example, states = chain
            outcomes: list[Outcome] = []
            for k, state in enumerate(states):
                if k == 0 or not self.reuse or outcomes[-1].error is not None:
                    reference = self._reference(state, example)
                else:
                    reference = Reference(outcomes[-1], _changed(state, states[k - 1]))
                outcomes.append(
                    self._settle(
                        eval_key(digests[id(state)], example),
                        lambda r=reference, st=state: self.runner.run(example, st, reference=r),
                        phase,
                    )
                )
            return outcomes

        done = parallel_map(run_chain, chains, self.num_threads)
        if self.reuse:
            for (example, states), outcomes in zip(chains, done):
                for state, outcome in zip(states, outcomes):
                    self._remember(state, example, outcome)

    def intervene(
        self, instructions: dict[str, str], items: list[Intervention], phase: str = "intervene"
    ) -> list[Outcome]:
        """Hinted re-runs (steps 1-2), each keyed by program, example and hints so it is paid once."""
        sk = state_key(instructions)
        keys = [f"hint:{sk}:{example_key(it.example)}:{digest(it.hints)}" for it in items]

        def pay_for(i: int) -> Callable[[], Outcome]:
            it = items[i]
            reuse = self.reuse and it.original is not None and it.original.error is None
            reference = Reference(it.original, frozenset(it.hints)) if reuse else None
            return lambda: self.runner.run(
                it.example, instructions, hints=it.hints, replay=it.replay, reference=reference
            )

        return self._run(keys, pay_for, phase)

    def _reference(self, instructions: dict[str, str], example: dspy.Example) -> Reference | None:
        """The kept run of ``example`` whose instructions differ from ``instructions`` in the fewest
        predictors (the latest among equals), with those predictors; None when reuse is off or none is kept."""
        best: Reference | None = None
        for kept, outcome in self._history.get(example_key(example), []) if self.reuse else []:
            changed = _changed(instructions, kept)
            if best is None or len(changed) <= len(best.changed):
                best = Reference(outcome, changed)
        return best

    def _remember(self, instructions: dict[str, str], example: dspy.Example, outcome: Outcome) -> None:
        if outcome.error is not None:
            return
        kept = self._history.setdefault(example_key(example), [])
        if any(ins == instructions for ins, _ in kept):
            return
        kept.append((instructions, outcome))
        del kept[:-REFERENCES_KEPT]

    def cost(self, instructions: dict[str, str], examples: list[dspy.Example]) -> int:
        """Metric calls that evaluating ``examples`` under ``instructions`` would charge now."""
        sk = state_key(instructions)
        return len(self.work.pending(eval_key(sk, ex) for ex in examples))

    def _run(self, keys: list[str], pay_for: Callable[[int], Callable[[], Outcome]], phase: str) -> list[Outcome]:
        """The outcomes for ``keys``: the new ones charged, then paid in parallel. ``pay_for(i)`` gives
        the work for ``keys[i]``; it is built (references chosen) now, in this thread, for new keys only."""
        fresh = self.work.pending(keys)
        self.budget.charge(len(fresh))
        first = {}
        for i, key in enumerate(keys):
            first.setdefault(key, i)
        work = {key: pay_for(first[key]) for key in fresh}

        def pay(key: str) -> Callable[[], Outcome]:  # a key settled elsewhere needs work only if that failed
            return work.get(key) or (lambda: pay_for(first[key])())

        parallel_map(lambda key: self._settle(key, pay(key), phase), fresh, self.num_threads)
        return [self._settle(key, pay(key), phase) for key in keys]

    def _settle(self, key: str, pay: Callable[[], Outcome], phase: str) -> Outcome:
        """The outcome for ``key`` (charged beforehand by the caller): paid once, counted once."""
        outcome, new = self.work.settle(key, pay)
        if new:
            self._count(outcome, phase)
            if not outcome.scored:  # its output equals its reference's: no metric call was made
                self.budget.refund(1)
                with self._lock:
                    self.reused += 1
        return outcome

    def _count(self, outcome: Outcome, phase: str) -> None:
        self.ledger.add("task", phase, outcome.usage)
        with self._lock:
            if outcome.attempts > 1:
                self.errors["retries"] += outcome.attempts - 1
            if outcome.error:
                self.errors[outcome.error.split(":")[0]] += 1
                self.errors[outcome.error] += 1
