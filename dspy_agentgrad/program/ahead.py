"""Program runs made ahead of their scoring (speculation), kept until a step asks for them.

A run made ahead is not scored: the evaluator takes it when a step asks for its key and scores it then, in the
order and under the budget of the procedure without speculation. One that nothing asked for is dropped with its
round; its LM usage is counted (phase ``speculation``) and journaled, so a resumed run counts it once and does
not make it again.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable

from ..runtime.budget import Budget
from ..runtime.paid_work import PaidWork
from ..runtime.usage import UsageLedger
from .runs import Execution, Outcome

#: Journal key prefix of a run made ahead that nothing asked for: its usage, no metric call.
AHEAD_KEY_PREFIX = "ahead:"


class RunsAhead:
    """The runs made ahead, by key, which the evaluator consults before it makes a run. ``errors`` and ``lock`` are
    the evaluator's: the retries of a run nobody asked for are counted with the others."""

    def __init__(
        self,
        work: PaidWork[Outcome],
        budget: Budget,
        ledger: UsageLedger,
        errors: Counter[str],
        lock: threading.Lock,
    ):
        self.work = work
        self.budget = budget
        self.ledger = ledger
        self.errors = errors
        self._lock = lock
        self._runs: dict[str, Execution] = {}

    def get(self, key: str) -> Execution | None:
        with self._lock:
            return self._runs.get(key)

    def keep(self, key: str, execution: Execution) -> None:
        """Keep ``execution`` for ``key`` unless a run is kept for it already."""
        with self._lock:
            self._runs.setdefault(key, execution)

    def take(self, key: str) -> Execution | None:
        """The run made ahead for ``key``, now asked for (it is no longer kept), or None."""
        with self._lock:
            return self._runs.pop(key, None)

    def not_run(self, keys: Iterable[str]) -> list[str]:
        """The distinct ``keys`` neither settled, in flight, journaled, nor run ahead."""
        with self._lock:
            ahead = set(self._runs)
        return [key for key in self.work.pending(keys) if key not in ahead and not self.work.memo.has(key)]

    def to_run(self, keys: Iterable[str]) -> set[str]:
        """The keys to run ahead now: an earlier segment's unused run ahead (journaled) is counted, not made again."""
        wanted = set()
        for key in self.not_run(keys):
            journaled = self.work.memo.get(AHEAD_KEY_PREFIX + key)
            if journaled is None:
                wanted.add(key)
            else:
                self.budget.charge_replayed_task(journaled["usage"])
                self._count_unused(journaled)
        return wanted

    def drop(self) -> int:
        """Forget the runs made ahead that nothing asked for, counting and journaling their LM usage."""
        with self._lock:
            unused, self._runs = list(self._runs.items()), {}
        for key, execution in unused:
            record = {"usage": execution.usage, "attempts": execution.attempts, "scored": False}  # no metric call
            self.work.memo.put(AHEAD_KEY_PREFIX + key, record)
            self._count_unused(record)
        if unused:
            self.work.memo.sync()
        return len(unused)

    def _count_unused(self, record: dict) -> None:
        self.ledger.add("task", "speculation", record["usage"])
        with self._lock:
            if record["attempts"] > 1:
                self.errors["retries"] += record["attempts"] - 1
