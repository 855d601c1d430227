"""Usage accounting: LM calls and tokens per role (task / prompt) and per phase.

``dspy.track_usage()`` is per thread, so each unit of work (one program run, one
prompt-LM call) is tracked where it runs and the totals are added here under a lock.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager

import dspy
from dspy.utils.usage_tracker import UsageTracker


def empty_usage() -> dict[str, int]:
    """Zero LM usage (calls and tokens), the unit every counter adds to."""
    return {"calls": 0, "prompt_tokens": 0, "completion_tokens": 0}


def _num(value) -> int:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0


class _SharedTracker(UsageTracker):
    """A usage tracker that DSPy's worker threads share rather than copy.

    ``ParallelExecutor`` (behind ``dspy.Parallel`` and ``module.batch``) deep-copies the
    tracker into each worker, so the LM calls a program makes there would be lost.
    """

    def __init__(self):
        super().__init__()
        self._lock = threading.Lock()

    def __deepcopy__(self, memo):
        return self

    def add_usage(self, lm: str, usage_entry: dict) -> None:
        with self._lock:
            super().add_usage(lm, usage_entry)


@contextmanager
def track() -> Iterator[dict[str, int]]:
    """Collect the LM calls made inside the block, in any DSPy worker thread, into the yielded dict
    (filled on exit)."""
    usage = empty_usage()
    tracker, parent = _SharedTracker(), dspy.settings.usage_tracker
    with dspy.context(usage_tracker=tracker):
        try:
            yield usage
        finally:
            if parent is not None:  # roll up into an enclosing tracker, as dspy.track_usage does
                for lm, entries in tracker.usage_data.items():
                    parent.usage_data[lm].extend(entries)
            for entries in tracker.usage_data.values():
                for entry in entries:
                    usage["calls"] += 1
                    usage["prompt_tokens"] += _num(entry.get("prompt_tokens"))
                    usage["completion_tokens"] += _num(entry.get("completion_tokens"))


class UsageLedger:
    """Totals of LM usage by role and by phase, safe to update from many threads."""

    def __init__(self):
        self._lock = threading.Lock()
        self.by_role: dict[str, dict[str, int]] = defaultdict(empty_usage)
        self.by_phase: dict[str, dict[str, int]] = defaultdict(empty_usage)

    def add(self, role: str, phase: str, usage: dict[str, int]) -> None:
        """Add one call's usage under its role and phase."""
        with self._lock:
            for bucket in (self.by_role[role], self.by_phase[phase]):
                for key in bucket:
                    bucket[key] += _num(usage.get(key, 0))

    def to_dict(self) -> dict:
        """Usage per role and per phase, for the result."""
        with self._lock:
            roles = {role: dict(self.by_role.get(role, empty_usage())) for role in ("task", "prompt")}
            return {**roles, "by_phase": {phase: dict(v) for phase, v in sorted(self.by_phase.items())}}
