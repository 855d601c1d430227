"""A stop rule measured on the zoo: end a run whose rounds stopped finding gains.

AgentGrad takes any ``(status: RunStatus) -> bool`` as a stop callback; this one is a user-level rule (no
change to the package), so the zoo can measure what it saves and what it costs before anyone makes it a default.
"""

from __future__ import annotations

from dspy_agentgrad.core.stoppers import RunStatus


class NoGainStop:
    """Stops once ``rounds`` rounds in a row have finished without raising the best validation score.

    The rounds counted are those finished after the last rise (or after the start, before any rise)."""

    def __init__(self, rounds: int):
        if rounds < 1:
            raise ValueError(f"rounds must be at least 1; got {rounds!r}")
        self.rounds = rounds
        self._best: float | None = None
        self._rose_at = 0

    def __call__(self, status: RunStatus) -> bool:
        if status.best_val_score is not None and (self._best is None or status.best_val_score > self._best):
            self._best, self._rose_at = status.best_val_score, status.rounds
        return status.rounds - self._rose_at >= self.rounds

    def __repr__(self) -> str:
        return f"NoGainStop(rounds={self.rounds})"
