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


def empty_usage() -> dict[str, int]:
    return {"calls": 0, "prompt_tokens": 0, "completion_tokens": 0}


def _num(value) -> int:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0


@contextmanager
def track() -> Iterator[dict[str, int]]:
    """Collect the LM calls made inside the block into the yielded dict (filled on exit)."""
    usage = empty_usage()
    with dspy.track_usage() as tracker:
        try:
            yield usage
        finally:
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
        with self._lock:
            for bucket in (self.by_role[role], self.by_phase[phase]):
                for key in bucket:
                    bucket[key] += _num(usage.get(key, 0))

    def to_dict(self) -> dict:
        with self._lock:
            roles = {role: dict(self.by_role.get(role, empty_usage())) for role in ("task", "prompt")}
            return {**roles, "by_phase": {phase: dict(v) for phase, v in sorted(self.by_phase.items())}}
