"""One place that calls the user's metric and turns its answer into (score, feedback).

Both DSPy's ``metric(example, pred, trace=None)`` and GEPA's
``metric(gold, pred, trace=None, pred_name=None, pred_trace=None)`` are accepted;
the result may be a number, a bool, or anything with a ``score`` (a
``dspy.Prediction(score=..., feedback=...)`` or a dict).
"""

from __future__ import annotations

import inspect
import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


class MetricError(TypeError):
    """The metric returned something that is not a score."""


@dataclass(frozen=True)
class MetricResult:
    score: float
    feedback: str


def _accepts_gepa_args(metric: Callable) -> bool:
    try:
        params = inspect.signature(metric).parameters
    except (TypeError, ValueError):
        return False
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return True
    return "pred_name" in params and "pred_trace" in params


class Metric:
    """Wraps the user's metric: a uniform call and strict checking of its result."""

    def __init__(self, metric: Callable):
        if not callable(metric):
            raise TypeError(
                f"metric must be callable as metric(example, pred, trace=None); got {type(metric).__name__}"
            )
        self.fn = metric
        self._gepa_style = _accepts_gepa_args(metric)

    def __call__(self, example: Any, prediction: Any) -> MetricResult:
        if self._gepa_style:
            raw = self.fn(example, prediction, None, None, None)
        else:
            raw = self.fn(example, prediction, None)
        return self.parse(raw)

    def parse(self, raw: Any) -> MetricResult:
        feedback = ""
        value = raw
        if isinstance(raw, dict):
            if "score" not in raw:
                raise MetricError(f"metric returned a dict without a 'score' key: {raw!r}")
            value, feedback = raw["score"], raw.get("feedback") or ""
        elif not isinstance(raw, (bool, int, float)) and hasattr(raw, "score"):
            value, feedback = raw.score, getattr(raw, "feedback", None) or ""
        if not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
            raise MetricError(
                "metric must return a number, a bool, or dspy.Prediction(score=<number>, feedback=<str>); "
                f"it returned {raw!r} ({type(raw).__name__})"
            )
        return MetricResult(float(value), str(feedback))


class ScoreOutOfRange(MetricError):
    """The metric returned a score outside ``[0, max_score]``."""


def check_score_range(score: float, max_score: float, example: Any) -> None:
    """Refuse a score outside ``[0, max_score]``: it would make every example look solved (or unsolvable)."""
    if 0 <= score <= max_score:
        return
    shown = repr(dict(example.inputs())) if hasattr(example, "inputs") else repr(example)
    shown = shown if len(shown) <= 200 else shown[:200] + " ...}"
    if score > max_score:
        fix = (
            f"pass max_score=<the metric's best score> to AgentGrad (e.g. max_score=100 for a 0-100 metric), "
            f"or scale the metric to [0, {max_score:g}]"
        )
    else:
        fix = "make the metric return scores >= 0 (0 = worst)"
    raise ScoreOutOfRange(
        f"the metric scored {score:g} on the example with inputs {shown}, outside [0, max_score={max_score:g}]; {fix}"
    )
