"""Stop callbacks: end a run early on a condition of yours, as ``dspy.GEPA``'s ``stop_callbacks`` do.

A stop callback is any callable ``(status: RunStatus) -> bool``; ``AgentGrad(stop_callbacks=[...])``
asks each one at every round start and after every candidate verdict, and ends the run (returning
the best program so far) when one says True. The step under way finishes first: a stop is never
in the middle of a candidate's check. Two are ready-made, under GEPA's names:
:class:`ScoreThresholdStopper` (a target validation score) and :class:`TimeoutStopCondition`
(a wall-time limit). GEPA's own stopper objects read GEPA's state and do not work here.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .events import AgentGradCallback, CandidateJudged, RoundEnd, RoundStart, RunStart, StopRun, ValidationScored


@dataclass(frozen=True)
class RunStatus:
    """Where a run stands when the stop callbacks are asked."""

    rounds: int  # rounds finished
    metric_calls: int
    initial_val_score: float | None  # None until the starting program's validation pass is in
    best_val_score: float | None
    elapsed_s: float  # since this compile() started


class ScoreThresholdStopper:
    """Stops once the best validation score reaches ``threshold``."""

    def __init__(self, threshold: float):
        self.threshold = threshold

    def __call__(self, status: RunStatus) -> bool:
        return status.best_val_score is not None and status.best_val_score >= self.threshold

    def __repr__(self) -> str:
        return f"ScoreThresholdStopper(threshold={self.threshold})"


class TimeoutStopCondition:
    """Stops once ``timeout_seconds`` have passed since ``compile`` started."""

    def __init__(self, timeout_seconds: float):
        self.timeout_seconds = timeout_seconds

    def __call__(self, status: RunStatus) -> bool:
        return status.elapsed_s >= self.timeout_seconds

    def __repr__(self) -> str:
        return f"TimeoutStopCondition(timeout_seconds={self.timeout_seconds})"


def check_stop_callbacks(callbacks: Any) -> list[Callable[[RunStatus], bool]]:
    """``callbacks`` as a list (one callable alone is accepted, as GEPA accepts it); anything else is refused."""
    if callbacks is None:
        return []
    listed = [callbacks] if callable(callbacks) else list(callbacks)
    for callback in listed:
        if not callable(callback):
            raise TypeError(
                f"stop_callbacks holds {callback!r}, which is not callable; a stop callback is a function "
                "(status: dspy_agentgrad.RunStatus) -> bool, e.g. dspy_agentgrad.ScoreThresholdStopper(0.9)"
            )
    return listed


class Stoppers(AgentGradCallback):
    """Asks the stop callbacks between steps and raises :class:`StopRun` when one says stop."""

    def __init__(self, callbacks: list[Callable[[RunStatus], bool]]):
        self.callbacks = callbacks
        self.started = time.monotonic()
        self.rounds, self.metric_calls = 0, 0
        self.initial: float | None = None
        self.best: float | None = None

    def _ask(self) -> None:
        status = RunStatus(self.rounds, self.metric_calls, self.initial, self.best, time.monotonic() - self.started)
        for callback in self.callbacks:
            if callback(status):
                best = "-" if self.best is None else f"{self.best:.4f}"
                raise StopRun(
                    f"stop callback {callback!r} said stop ({self.rounds} round(s) done, {self.metric_calls} metric "
                    f"calls, best validation {best}, {status.elapsed_s:.0f} s)"
                )

    def on_run_start(self, event: RunStart) -> None:
        self.started = time.monotonic()

    def on_validation_scored(self, event: ValidationScored) -> None:
        if event.candidate is None:  # the starting program's; a candidate's counts at its verdict
            self.initial = self.best = event.score

    def on_round_start(self, event: RoundStart) -> None:
        self.metric_calls = event.metric_calls
        self._ask()

    def _after_verdict(self, event: CandidateJudged) -> None:
        self.best, self.metric_calls = event.best_score, event.metric_calls
        self._ask()

    on_candidate_accepted = _after_verdict
    on_candidate_rejected = _after_verdict

    def on_round_end(self, event: RoundEnd) -> None:
        self.rounds, self.metric_calls = event.record.round + 1, event.record.metric_calls
        self._ask()
