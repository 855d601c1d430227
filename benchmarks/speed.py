"""Time to quality: metric calls and wall time each optimizer needed to reach a common target.

The target is a fraction (default 90%) of the best final validation score among the optimizers
of one benchmark run (the baseline excluded); an optimizer reaches it at the first point of its
best-so-far validation curve at or above it. Wall time comes from ``details.curve_seconds``
(seconds since the optimizer started at which the curve point's metric call was made).
"""

from __future__ import annotations

from typing import Any

TARGET_FRACTION = 0.9


def time_to_target(entries: dict[str, dict], fraction: float = TARGET_FRACTION) -> dict[str, dict[str, Any]]:
    """Per optimizer: ``target``, ``calls`` and ``seconds`` to reach it (None when never reached)."""
    finals = [e.get("val_score") for n, e in entries.items() if n != "baseline" and e.get("status") == "done"]
    finals = [v for v in finals if v is not None]
    if not finals:
        return {}
    target = fraction * max(finals)
    return {
        name: {"target": target, **first_reach(entry, target)}
        for name, entry in entries.items()
        if name != "baseline" and entry.get("status") == "done"
    }


def first_reach(entry: dict, score: float) -> dict[str, Any]:
    """``calls``, ``seconds``, ``task_calls`` and ``task_tokens`` (task-LM spend) at the first point of an
    optimizer's best-so-far curve at or above ``score``; None where not reached or not recorded."""
    curve = entry.get("curve") or []
    details = entry.get("details") or {}
    hit = next((i for i, (_calls, value) in enumerate(curve) if value >= score - 1e-12), None)

    def at(key: str) -> Any:
        series = details.get(key) or []
        return None if hit is None or hit >= len(series) else series[hit]

    return {
        "calls": None if hit is None else curve[hit][0],
        "seconds": at("curve_seconds"),
        "task_calls": at("curve_task_calls"),
        "task_tokens": at("curve_task_tokens"),
    }


def speed_table(benchmarks: dict[str, dict], fraction: float = TARGET_FRACTION) -> str:
    """Markdown rows: benchmark, optimizer, target, metric calls and seconds to reach it."""
    lines = [
        f"| Benchmark | Optimizer | Target ({100 * fraction:.0f}% of best final val) | Metric calls to target | "
        "Wall time to target (s) |",
        "|---|---|---|---|---|",
    ]
    for bench, block in benchmarks.items():
        for name, hit in time_to_target(block.get("optimizers", {}), fraction).items():
            calls = "not reached" if hit["calls"] is None else str(hit["calls"])
            secs = "–" if hit["seconds"] is None else f"{hit['seconds']:.1f}"
            lines.append(f"| {bench} | {name} | {100 * hit['target']:.1f} | {calls} | {secs} |")
    return "\n".join(lines) if len(lines) > 2 else ""
