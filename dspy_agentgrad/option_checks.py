"""Checks of single option values: integers, real numbers and the metric's score range."""

from __future__ import annotations

import math


def is_int(value: object) -> bool:
    """An int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def check_int(name: str, value: object, minimum: int | None, optional: bool = False) -> None:
    """An integer option (``None`` allowed when ``optional``), at least ``minimum``."""
    if value is None and optional:
        return
    if not is_int(value) or (minimum is not None and value < minimum):
        bound = "an integer" if minimum is None else f"an integer >= {minimum}"
        raise ValueError(f"{name} must be {bound}{' or None' if optional else ''}; got {value!r}")


def check_number(
    name: str, value: object, low: float, high: float, low_open: bool = False, optional: bool = False
) -> None:
    """A real option in ``[low, high]`` (``(low, high]`` when ``low_open``); never NaN, a bool or a string."""
    if value is None and optional:
        return
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or not (low < value if low_open else low <= value) or value > high:
        span = f"{'(' if low_open else '['}{low:g}, {high:g}]".replace("inf]", "inf)").replace("[-inf", "(-inf")
        raise ValueError(f"{name} must be a finite number in {span}{' or None' if optional else ''}; got {value!r}")


def check_scores(max_score: object, failure_score: object, fix_threshold: object) -> None:
    """Any finite ``max_score`` (the metric's best score); ``failure_score`` (what a failed run scores) below it,
    so that a failure never counts as a success; ``fix_threshold`` in ``(failure_score, max_score]``."""
    check_number("max_score", max_score, -math.inf, math.inf)
    check_number("failure_score", failure_score, -math.inf, max_score)
    if failure_score >= max_score:
        raise ValueError(
            f"failure_score={failure_score!r} must be below max_score={max_score!r}: a run that fails (an LM error, "
            "a metric that raises) would count as a success; pass failure_score=<the metric's worst score>"
            + (" (needed when max_score is 0 or below, e.g. failure_score=-100)" if max_score <= 0 else "")
        )
    check_number("fix_threshold", fix_threshold, failure_score, max_score, low_open=True, optional=True)
