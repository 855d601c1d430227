"""One place that calls the user's metric and turns its answer into (score, feedback).

The metric is called the way DSPy and GEPA call it: the example and the prediction
positionally, then ``trace``, ``pred_name`` and ``pred_trace`` (all ``None``: a whole
program run is scored) by name, each only when the metric takes it (by that name or
through ``**kwargs``). So ``metric(example, pred)``, ``metric(example, pred, trace=None)``,
GEPA's ``metric(gold, pred, trace, pred_name, pred_trace)`` and
``metric(gold, pred, trace=None, **kwargs)`` all work. A metric written as a ``dspy.Module``
(``dspy.evaluate.SemanticF1``) is read through its ``forward``: ``Module.__call__`` takes
``(*args, **kwargs)`` and hands them on. The result may be a number, a bool (numpy's
included), or anything with a ``score`` (a ``dspy.Prediction(score=..., feedback=...)`` or a dict),
optionally with ``objective_scores`` (:mod:`.objectives`). An ``async def`` metric is awaited
(:mod:`.awaiting`).

Any finite score up to ``max_score`` is a score (docs/metrics.md): a run fails when it scores below
``max_score``. A score above ``max_score`` by float rounding alone (a rubric's 0.2+0.4+0.3+0.1) counts
as ``max_score``.
"""

from __future__ import annotations

import inspect
import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..runtime.jsonable import example_key
from .awaiting import resolved
from .objectives import parse_objectives

#: Relative slack for float rounding when a score is compared with ``max_score``.
ROUNDING = 1e-9


class MetricError(TypeError):
    """The metric returned something that is not a score."""


class ScoreOutOfRange(MetricError):
    """The metric returned a score above ``max_score``."""


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
    """How to call one metric: how many ``None`` to pass positionally after (example, pred), which by name,
    and the call as text (what error messages say)."""

    extra_positional: int
    by_name: tuple[str, ...]
    shown: str


def _forwards(metric: Callable, params: dict[str, inspect.Parameter]) -> bool:
    """Whether ``metric`` only hands ``(*args, **kwargs)`` on to its ``forward`` (a ``dspy.Module``)."""
    kinds = sorted(p.kind for p in params.values())
    generic = kinds == [inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD]
    return generic and callable(getattr(metric, "forward", None))


def _target(metric: Callable) -> tuple[Any, str]:
    """The callable whose signature says how ``metric`` is called, and its name for messages."""
    name = getattr(metric, "__name__", None) or type(metric).__name__
    try:
        params = dict(inspect.signature(metric).parameters)
    except (TypeError, ValueError):
        return None, name
    if _forwards(metric, params):
        return metric.forward, f"{type(metric).__name__}.forward"
    return metric, name


def _call_plan(metric: Callable) -> _CallPlan:
    target, name = _target(metric)
    if target is None:  # a builtin or C callable: the plain DSPy form
        return _CallPlan(1, (), f"{name}(example, prediction, None)")
    params = inspect.signature(target).parameters
    kinds = [p.kind for p in params.values()]
    positional = [p for p in params.values() if p.kind in _POSITIONAL]
    if len(positional) < 2 and inspect.Parameter.VAR_POSITIONAL not in kinds:
        raise TypeError(
            f"metric must take (example, prediction) as its first two arguments, as metric(example, pred, trace=None); "
            f"{name} takes {inspect.signature(target)}"
        )
    # a required third positional parameter under another name (metric(ex, pred, tr)) gets None positionally
    extra = [p for p in positional[2:] if p.name not in OPTIONAL_ARGS and p.default is p.empty]
    by_name = tuple(
        n
        for n in OPTIONAL_ARGS
        if (n in params and params[n].kind is not inspect.Parameter.POSITIONAL_ONLY)
        or inspect.Parameter.VAR_KEYWORD in kinds
    )
    shown = ", ".join(["example", "prediction", *["None"] * len(extra), *[f"{n}=None" for n in by_name]])
    return _CallPlan(len(extra), by_name, f"{name}({shown})")


def describe_example(example: Any, limit: int = 200) -> str:
    """A short view of an example for an error message: its key (as the journal names it) and its inputs."""
    try:
        shown = repr(dict(example.inputs())) if hasattr(example, "inputs") else repr(example)
    except ValueError:  # an example without input fields
        shown = repr(example)
    shown = shown if len(shown) <= limit else shown[:limit] + " ...}"
    try:
        key = f" (key {example_key(example)})"
    except Exception:  # noqa: BLE001 - a view for a message never hides the error it describes
        key = ""
    return f"the example{key} with inputs {shown}"


class Metric:
    """Wraps the user's metric: a uniform call and strict checking of its result."""

    def __init__(self, metric: Callable):
        if not callable(metric):
            raise TypeError(
                f"metric must be callable as metric(example, pred, trace=None); got {type(metric).__name__}"
            )
        self.fn = metric
        self._plan = _call_plan(metric)

    @property
    def called_as(self) -> str:
        """How the metric is called, as text: ``metric(example, prediction, trace=None)``."""
        return self._plan.shown

    def __call__(self, example: Any, prediction: Any) -> MetricResult:
        extra = (None,) * self._plan.extra_positional
        raw = resolved(self.fn(example, prediction, *extra, **dict.fromkeys(self._plan.by_name)))
        try:
            return self.parse(raw)
        except MetricError as error:
            raise MetricError(f"{error}, on {describe_example(example)}; it was called as {self.called_as}") from None

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
                "metric must return a number (finite: not NaN or inf), a bool, or "
                f"dspy.Prediction(score=<number>, feedback=<str>); it returned {raw!r} ({type(raw).__name__})"
            )
        try:
            objectives = parse_objectives(raw)
        except TypeError as error:
            raise MetricError(f"metric returned bad objective_scores: {error}") from None
        return MetricResult(float(value), str(feedback), objectives)


def checked_score(score: float, max_score: float, example: Any) -> float:
    """``score`` when it is at most ``max_score`` (``max_score`` when above it by float rounding alone); a score
    above ``max_score`` is refused: the run would count as better than perfect and every gain would be wrong."""
    if score <= max_score:
        return score
    if score - max_score <= ROUNDING * max(1.0, abs(max_score)):
        return max_score
    raise ScoreOutOfRange(
        f"the metric scored {score!r} on {describe_example(example)}, above max_score={max_score!r}; pass "
        "max_score=<the metric's best score> to AgentGrad (e.g. max_score=100 for a 0-100 metric), or scale the "
        f"metric so that no score exceeds {max_score!r}"
    )
