"""Scored program runs with budget, caching, replay of paid results, and usage accounting.

Every scored run is one metric call. A run is keyed by what determines it (the
instructions, the example, and for an intervention the hinted predictor and the
hint); a key seen before in this run is free, a key first seen in this run is
charged once, whether it is computed now or replayed from ``log_dir`` after a
resume. That makes a resumed run spend exactly what the uninterrupted run spends.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import dspy

from .budget import Budget
from .jsonable import digest, example_key
from .paid_work import PaidWork
from .parallel import parallel_map
from .store import Memo
from .tracing import Outcome, ProgramRunner, Step, check_first_runs
from .usage import UsageLedger


@dataclass
class Intervention:
    """Re-run ``example`` with ``hints`` (predictor name -> hint) given to every call of those
    predictors; the calls in ``replay`` (of predictors that ran before them) are replayed."""

    example: dspy.Example
    hints: dict[str, str]
    replay: list[Step]


def state_key(instructions: dict[str, str]) -> str:
    return digest(instructions)


def eval_key(instructions: dict[str, str], example: dspy.Example) -> str:
    """The cache key of a plain scored run (program state, example)."""
    return f"eval:{state_key(instructions)}:{example_key(example)}"


class Evaluator:
    """Scored program runs, each one metric call, charged before they start."""

    def __init__(self, runner: ProgramRunner, memo: Memo, budget: Budget, ledger: UsageLedger, num_threads: int = 1):
        self.runner = runner
        self.work: PaidWork[Outcome] = PaidWork(memo, Outcome.to_dict, Outcome.from_dict)
        self.budget = budget
        self.ledger = ledger
        self.num_threads = num_threads
        self.errors: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._first_runs_checked = False

    def evaluate(self, instructions: dict[str, str], examples: list[dspy.Example], phase: str) -> list[Outcome]:
        jobs = [(eval_key(instructions, ex), lambda ex=ex: self.runner.run(ex, instructions)) for ex in examples]
        outcomes = self._run(jobs, phase)
        if not self._first_runs_checked:
            self._first_runs_checked = True
            check_first_runs(outcomes)
        return outcomes

    def mean_score(self, instructions: dict[str, str], examples: list[dspy.Example], phase: str) -> float:
        outcomes = self.evaluate(instructions, examples, phase)
        return sum(o.score for o in outcomes) / len(outcomes) if outcomes else 0.0

    def intervene(
        self, instructions: dict[str, str], items: list[Intervention], phase: str = "intervene"
    ) -> list[Outcome]:
        sk = state_key(instructions)
        jobs = [
            (
                f"hint:{sk}:{example_key(it.example)}:{digest(it.hints)}",
                lambda it=it: self.runner.run(it.example, instructions, hints=it.hints, replay=it.replay),
            )
            for it in items
        ]
        return self._run(jobs, phase)

    def cost(self, instructions: dict[str, str], examples: list[dspy.Example]) -> int:
        """Metric calls that evaluating ``examples`` under ``instructions`` would charge now."""
        return len(self.work.pending(eval_key(instructions, ex) for ex in examples))

    def _run(self, jobs: list[tuple[str, Callable[[], Outcome]]], phase: str) -> list[Outcome]:
        thunks = dict(jobs)
        fresh = self.work.pending(key for key, _ in jobs)
        self.budget.charge(len(fresh))

        def settle(key: str) -> Outcome:
            outcome, new = self.work.settle(key, thunks[key])
            if new:
                self._count(outcome, phase)
            return outcome

        parallel_map(settle, fresh, self.num_threads)
        return [settle(key) for key, _ in jobs]

    def _count(self, outcome: Outcome, phase: str) -> None:
        self.ledger.add("task", phase, outcome.usage)
        with self._lock:
            if outcome.attempts > 1:
                self.errors["retries"] += outcome.attempts - 1
            if outcome.error:
                self.errors[outcome.error.split(":")[0]] += 1
                self.errors[outcome.error] += 1
