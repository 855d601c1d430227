"""Where AgentGrad's metric calls, task-LM calls and wall time went, from compare folders
(``benchmarks.synthetic.compare``).

``python -m benchmarks.synthetic.profile DIR [DIR ...]`` prints, per folder, the median over its seeds of
each phase's share of AgentGrad's metric calls, of its task-LM calls and of its wall time (``phase_calls``,
``usage["by_phase"]`` and ``phase_wall_s`` of the result: the batch ``evaluate``, single-hint levels
``intervene``, ``cumulative`` hints, cluster checks ``minibatch``, ``validate``), the rounds and candidates
judged, and the share of the wall that came after the final best score was first reached. Metric and task-LM
shares differ where steps reword: a run is one metric call but up to one task-LM call per step it re-runs.
Wall shares add up to more than 1 where phases overlap, as the starting validation pass does with the first
round.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

PHASES = ("evaluate", "intervene", "cumulative", "minibatch", "validate")


def shares(entry: dict) -> dict:
    """One AgentGrad run (a results-file entry): each phase's share of its metric calls, task-LM calls and
    wall, the rounds and candidates judged, and the share of the wall after the final best was first reached."""
    result = entry["details"]["result"]
    calls, wall = result.get("phase_calls", {}), result.get("phase_wall_s", {})
    usage = result.get("usage", {})
    task_calls, total_task = usage.get("by_phase", {}), max(usage.get("task", {}).get("calls", 0), 1)
    seconds = entry["details"].get("curve_seconds") or [entry["wall_time_s"]]
    best_at = next(s for (c, v), s in zip(entry["curve"], seconds) if v >= entry["val_score"] - 1e-12)
    total_calls, total_wall = max(result["metric_calls"], 1), max(entry["wall_time_s"], 1e-9)
    row = {f"calls {p}": calls.get(p, 0) / total_calls for p in PHASES}
    row |= {f"task {p}": task_calls.get(p, {}).get("calls", 0) / total_task for p in PHASES}
    row |= {f"wall {p}": wall.get(p, 0.0) / total_wall for p in PHASES}
    return row | {
        "rounds": len(result["rounds"]),
        "candidates": len(result["candidates"]),
        "wall after final best": (entry["wall_time_s"] - best_at) / total_wall,
    }


def profile(folder: Path) -> dict:
    """Medians over the seeds of one compare folder."""
    rows = [
        shares(json.loads(path.read_text())["benchmarks"]["synthetic"]["optimizers"]["agentgrad"])
        for path in sorted(folder.glob("seed*/results.json"))
    ]
    return {key: statistics.median(r[key] for r in rows) for key in rows[0]} if rows else {}


def main(argv: list[str] | None = None) -> int:
    folders = [Path(a) for a in (sys.argv[1:] if argv is None else argv)]
    profiles = {f.name: profile(f) for f in folders}
    keys = next((list(p) for p in profiles.values() if p), [])
    print("| folder | " + " | ".join(keys) + " |")
    print("|---|" + "---|" * len(keys))
    for name, p in profiles.items():
        cells = [f"{p[k]:.0%}" if k.startswith(("calls", "task", "wall")) else f"{p[k]:g}" for k in keys]
        print(f"| {name} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
