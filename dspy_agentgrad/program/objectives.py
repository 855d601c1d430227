"""Objectives besides the score: what a metric reports in ``objective_scores``, their validation means, and
the guards that keep a candidate from buying score with an objective that must not drop.

A metric may return ``dspy.Prediction(score=..., feedback=..., objective_scores={"quality": 1.0, ...})``, as
for ``dspy.GEPA``; every objective is higher-is-better. The score alone decides gains, as before; a guard
``objective_guards={"privacy": 0.0}`` adds one condition for a candidate to be kept: its validation mean of
that objective may fall below the best program's by at most the tolerance. A run without a metric call's
answer (a failed run) counts 0 for every objective, as it counts ``failure_score`` for the score.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping
from typing import Any


def parse_objectives(raw: Any) -> dict[str, float]:
    """The ``objective_scores`` of a metric's answer (a dict key or an attribute), as name -> float; {} if none."""
    found = raw.get("objective_scores") if isinstance(raw, dict) else getattr(raw, "objective_scores", None)
    if found is None:
        return {}
    if not isinstance(found, Mapping):
        raise TypeError(f"objective_scores must be a dict of objective name -> number; got {found!r}")
    out = {}
    for name, value in found.items():
        if type(value).__module__ == "numpy" and getattr(value, "shape", None) == ():
            value = value.item()
        if not isinstance(name, str) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
            raise TypeError(f"objective_scores must map names to finite numbers; got {name!r}: {value!r}")
        out[name] = float(value)
    return out


def objective_means(per_run: Iterable[Mapping[str, float]]) -> dict[str, float]:
    """The mean of each objective over runs (a run without it counts 0), by name in sorted order."""
    runs = list(per_run)
    names = sorted({name for run in runs for name in run})
    return {name: sum(run.get(name, 0.0) for run in runs) / len(runs) for name in names} if runs else {}


def check_guards(guards: Any) -> dict[str, float] | None:
    """``objective_guards`` checked: None, or a dict of objective name -> tolerance (a number >= 0)."""
    if guards is None:
        return None
    if not isinstance(guards, Mapping) or not guards:
        raise ValueError(
            "objective_guards must be a non-empty dict of objective name -> tolerance, e.g. {'privacy': 0.0}; "
            f"got {guards!r}"
        )
    for name, tolerance in guards.items():
        ok = isinstance(tolerance, (int, float)) and not isinstance(tolerance, bool) and math.isfinite(tolerance)
        if not isinstance(name, str) or not ok or tolerance < 0:
            raise ValueError(
                f"objective_guards[{name!r}] must be a tolerance >= 0 (how far the objective's validation mean may "
                f"fall); got {tolerance!r}"
            )
    return {name: float(tolerance) for name, tolerance in guards.items()}


def guard_violations(
    guards: Mapping[str, float] | None, best: Mapping[str, float], candidate: Mapping[str, float]
) -> list[str]:
    """The guarded objectives on which ``candidate`` falls below ``best`` by more than their tolerance, said
    in words. An objective the metric never reported is 0 on both sides, so it cannot block."""
    out = []
    for name, tolerance in (guards or {}).items():
        before, after = best.get(name, 0.0), candidate.get(name, 0.0)
        if after < before - tolerance - 1e-12:
            out.append(f"{name} {before:.4f} -> {after:.4f} (tolerance {tolerance:g})")
    return out


def check_guarded_objectives(guards: Mapping[str, float] | None, reported: Mapping[str, float]) -> None:
    """Stop after the first validation pass when a guard names an objective the metric never reported (a typo,
    or a metric without ``objective_scores``): such a guard could never block anything."""
    missing = sorted(set(guards or {}) - set(reported))
    if missing:
        shown = ", ".join(sorted(reported)) or "none (it returns no objective_scores)"
        raise ValueError(
            f"objective_guards names {missing}, which the metric did not report on any validation example; "
            f"the objectives it reports: {shown}"
        )
