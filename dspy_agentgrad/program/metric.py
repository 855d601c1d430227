"""One place that calls the user's metric and turns its answer into (score, feedback).

The metric is called the way DSPy and GEPA call it: the example and the prediction
positionally, then ``trace``, ``pred_name`` and ``pred_trace`` (all ``None``: a whole
program run is scored) by name, each only when the metric takes it (by that name or
through ``**kwargs``). So ``metric(example, pred)``, ``metric(example, pred, trace=None)``,
GEPA's ``metric(gold, pred, trace, pred_name, pred_trace)`` and
``metric(gold, pred, trace=None, **kwargs)`` all work. The result may be a number, a bool
(numpy's included), or anything with a ``score`` (a ``dspy.Prediction(score=..., feedback=...)`` or a dict),
optionally with ``objective_scores`` (:mod:`.objectives`). An ``async def`` metric is awaited
(:mod:`.awaiting`).
"""

from __future__ import annotations

import inspect
import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .awaiting import resolved
from .objectives import parse_objectives


class MetricError(TypeError):
    """The metric returned something that is not a score."""


@dataclass(frozen=True)
class MetricResult:
    """A metric's answer in one shape, whatever the user's metric returned."""

    score: float
    feedback: str
    objectives: dict[str, float] = field(default_factory=dict)  # the metric's ``objective_scores``, if any


OPTIONAL_ARGS = ("trace", "pred_name", "pred_trace")
_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


@dataclass(frozen=True)
class _CallPlan:
    """How to call one metric: how many ``None`` to pass positionally after (example, pred), which by name."""

    extra_positional: int
    by_name: tuple[str, ...]


def _call_plan(metric: Callable) -> _CallPlan:
    try:
        params = inspect.signature(metric).parameters
    except (TypeError, ValueError):  # a builtin or C callable: the plain DSPy form
        return _CallPlan(1, ())
    kinds = [p.kind for p in params.values()]
    positional = [p for p in params.values() if p.kind in _POSITIONAL]
    if len(positional) < 2 and inspect.Parameter.VAR_POSITIONAL not in kinds:
        raise TypeError(
            "metric must take (example, prediction) as its first two arguments, as metric(example, pred, trace=None)"
        )
    # a required third positional parameter under another name (metric(ex, pred, tr)) gets None positionally
    extra = [p for p in positional[2:] if p.name not in OPTIONAL_ARGS and p.default is p.empty]
    by_name = tuple(
        n
        for n in OPTIONAL_ARGS
        if (n in params and params[n].kind is not inspect.Parameter.POSITIONAL_ONLY)
        or inspect.Parameter.VAR_KEYWORD in kinds
    )
    return _CallPlan(len(extra), by_name)


class Metric:
    """Wraps the user's metric: a uniform call and strict checking of its result."""

    def __init__(self, metric: Callable):
        if not callable(metric):
            raise TypeError(
                f"metric must be callable as metric(example, pred, trace=None); got {type(metric).__name__}"
            )
        self.fn = metric
        self._plan = _call_plan(metric)

    def __call__(self, example: Any, prediction: Any) -> MetricResult:
        extra = (None,) * self._plan.extra_positional
        raw = resolved(self.fn(example, prediction, *extra, **dict.fromkeys(self._plan.by_name)))
        return self.parse(raw)

    def parse(self, raw: Any) -> MetricResult:
        """A :class:`MetricResult` from a number, bool, dict or ``dspy.Prediction``; an error says what to return."""
        feedback = ""
        value = raw
        if isinstance(raw, dict):
            if "score" not in raw:
                raise MetricError(f"metric returned a dict without a 'score' key: {raw!r}")
            value, feedback = raw["score"], raw.get("feedback") or ""
        elif not isinstance(raw, (bool, int, float)) and hasattr(raw, "score"):
            value, feedback = raw.score, getattr(raw, "feedback", None) or ""
        if type(value).__module__ == "numpy" and getattr(value, "shape", None) == ():
            value = value.item()  # np.bool_ is not a numbers.Real; every numpy scalar has a Python twin
        if not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
            raise MetricError(
                "metric must return a number, a bool, or dspy.Prediction(score=<number>, feedback=<str>); "
                f"it returned {raw!r} ({type(raw).__name__})"
            )
        try:
            objectives = parse_objectives(raw)
        except TypeError as error:
            raise MetricError(f"metric returned bad objective_scores: {error}") from None
        return MetricResult(float(value), str(feedback), objectives)


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
