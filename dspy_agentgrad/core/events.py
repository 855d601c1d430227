"""Typed events of an AgentGrad run, and the callback protocol that receives them.

The engine emits one event per step of the paper's round. Subscribe by passing
objects to ``AgentGrad(..., callbacks=[...])``; subclass :class:`AgentGradCallback`
and override the methods you need (every method is optional and does nothing by
default). The progress bar and the ``state.json`` snapshot are callbacks too.

A callback that raises is logged and the run goes on: observing a run must not
end it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from .state import AttributionReport, CandidateRecord, RoundRecord

logger = logging.getLogger("dspy_agentgrad")


@dataclass(frozen=True)
class RunStart:
    """The run begins: the predictors and the sizes and caps it runs under."""

    predictors: list[str]
    n_train: int
    n_val: int
    max_metric_calls: int | None
    max_rounds: int | None
    resumed: bool


@dataclass(frozen=True)
class ValidationScored:
    """A full validation pass: the starting program's (``candidate=None``) or a candidate's."""

    round: int | None
    score: float
    best_score: float
    metric_calls: int
    candidate: CandidateRecord | None = None


@dataclass(frozen=True)
class RoundStart:
    """A round begins: its minimum cluster size and batch, and the metric calls spent so far."""

    round: int
    min_cluster_size: int
    batch_size: int
    metric_calls: int


@dataclass(frozen=True)
class AttributionDone:
    """Steps 1-2 of a round are done: who was blamed for which failure."""

    round: int
    report: AttributionReport
    failures: int
    metric_calls: int


@dataclass(frozen=True)
class CandidateProposed:
    """A rewrite is about to be judged: the cluster it answers and the new instruction."""

    round: int
    predictor: str
    cluster_size: int
    gradient: str
    instruction: str


@dataclass(frozen=True)
class CandidateJudged:
    """Sent to ``on_candidate_accepted`` or ``on_candidate_rejected``."""

    candidate: CandidateRecord
    best_score: float
    metric_calls: int


@dataclass(frozen=True)
class RoundEnd:
    """A round is done: its record (counts, decisions, best score so far)."""

    record: RoundRecord


@dataclass(frozen=True)
class RunEnd:
    """The run stopped: why, and the scores it went from and to."""

    stop_reason: str
    interrupted: bool
    initial_score: float | None
    best_score: float | None
    metric_calls: int
    rounds: int


class AgentGradCallback:
    """Base class with a no-op method per event; override what you need."""

    def on_run_start(self, event: RunStart) -> None:
        """Called once, before the starting program is validated."""

    def on_validation_scored(self, event: ValidationScored) -> None:
        """Called after each full validation pass (the starting program's, then each candidate's)."""

    def on_round_start(self, event: RoundStart) -> None:
        """Called when a round draws its batch."""

    def on_attribution(self, event: AttributionDone) -> None:
        """Called when a round's failures are attributed (steps 1-2)."""

    def on_candidate_proposed(self, event: CandidateProposed) -> None:
        """Called when a rewrite is about to be judged."""

    def on_candidate_accepted(self, event: CandidateJudged) -> None:
        """Called when a rewrite won both stages and became the current program."""

    def on_candidate_rejected(self, event: CandidateJudged) -> None:
        """Called when a rewrite was not kept (its record says why)."""

    def on_round_end(self, event: RoundEnd) -> None:
        """Called when a round is done."""

    def on_run_end(self, event: RunEnd) -> None:
        """Called once when the run stops, for any reason (Ctrl-C included)."""


EVENT_METHODS = tuple(name for name in vars(AgentGradCallback) if name.startswith("on_"))


class Dispatcher:
    """Delivers each event to every callback that has the method; errors are logged, not raised."""

    def __init__(self, callbacks: list[Any] | tuple[Any, ...] = ()):
        for callback in callbacks:
            if not any(callable(getattr(callback, name, None)) for name in EVENT_METHODS):
                raise TypeError(
                    f"callback {callback!r} has none of the event methods {', '.join(EVENT_METHODS)}; "
                    "subclass dspy_agentgrad.AgentGradCallback"
                )
        self.callbacks = list(callbacks)
        self._warned: set[tuple[int, str]] = set()

    def __call__(self, method: str, event: Any) -> None:
        for callback in self.callbacks:
            handler = getattr(callback, method, None)
            if handler is None:
                continue
            try:
                handler(event)
            except Exception:
                if (id(callback), method) not in self._warned:
                    self._warned.add((id(callback), method))
                    logger.exception("callback %s.%s raised; the run goes on", type(callback).__name__, method)
