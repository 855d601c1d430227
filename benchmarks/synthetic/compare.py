"""Several seeds of the synthetic benchmark through the head-to-head runner, and a per-seed table.

``python -m benchmarks.synthetic.compare --seeds 0,1,2 --out DIR [-- extra benchmarks.run options]``
runs ``python -m benchmarks.run --bench synthetic --seed S --split-seed S --out DIR/seedS ...`` for each
seed (skip with ``--summary-only``), then prints per seed and optimizer: final validation and test
score, metric calls and wall time to reach 90% of the best final validation score of that seed
(common target, :mod:`benchmarks.speed`), LM calls and tokens; then medians and AgentGrad/GEPA ratios.
A second view compares at GEPA's own final score: the calls and seconds GEPA took to first reach
it against those AgentGrad took to reach it (a seed where GEPA's target is not reached by GEPA
itself, as above, says nothing about the speed to a common level; this one always has GEPA's time).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from benchmarks.speed import first_reach, time_to_target

DEFAULT_RUN = [
    "--task-lm",
    "synthetic",
    "--optimizers",
    "baseline,agentgrad,gepa",
    "--max-metric-calls",
    "400",
    "--train",
    "50",
    "--val",
    "50",
    "--test",
    "100",
    "--num-threads",
    "8",
    "--cache",
    "off",
]


def summarize(files: list[Path]) -> tuple[list[dict], str]:
    rows = []
    for path in files:
        results = json.loads(path.read_text())
        seed = results["config"]["seed"]
        entries = results["benchmarks"]["synthetic"]["optimizers"]
        hits = time_to_target(entries)
        for name, hit in hits.items():
            e = entries[name]
            usage = e.get("usage", {})
            tokens = sum(u.get("prompt_tokens", 0) + u.get("completion_tokens", 0) for u in usage.values())
            rows.append(
                {
                    "seed": seed,
                    "optimizer": name,
                    "val": e["val_score"],
                    "test": e.get("test_score"),
                    "target": hit["target"],
                    "calls_to_target": hit["calls"],
                    "seconds_to_target": hit["seconds"],
                    "metric_calls": e["metric_calls"],
                    "wall_s": e["wall_time_s"],
                    "lm_calls": {role: u.get("calls", 0) for role, u in usage.items()},
                    "tokens": tokens,
                }
            )
    lines = [
        "| seed | optimizer | final val | test | target | calls to target | s to target | metric calls | wall s | "
        "task / prompt LM calls | tokens |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(rows, key=lambda r: (r["seed"], r["optimizer"])):
        lines.append(
            f"| {r['seed']} | {r['optimizer']} | {r['val']:.3f} | {r['test']:.3f} | {r['target']:.3f} | "
            f"{r['calls_to_target'] if r['calls_to_target'] is not None else 'not reached'} | "
            f"{r['seconds_to_target'] if r['seconds_to_target'] is not None else '–'} | {r['metric_calls']} | "
            f"{r['wall_s']:.1f} | {r['lm_calls'].get('task', 0)} / {r['lm_calls'].get('prompt', 0)} | {r['tokens']} |"
        )
    lines += ["", ratio_lines(rows), "", *at_gepa_final(files)]
    return rows, "\n".join(lines)


def at_gepa_final(files: list[Path]) -> list[str]:
    """Per seed: calls and seconds to first reach GEPA's final validation score, GEPA's and AgentGrad's."""
    lines = [
        "At GEPA's final validation score (the level GEPA ends at):",
        "",
        "| seed | GEPA final val | GEPA calls / s to reach it | AgentGrad calls / s to reach it | calls ratio "
        "| time ratio |",
        "|---|---|---|---|---|---|",
    ]
    call_ratios, time_ratios = [], []
    for path in files:
        results = json.loads(path.read_text())
        entries = results["benchmarks"]["synthetic"]["optimizers"]
        if "gepa" not in entries or "agentgrad" not in entries:
            continue
        level = entries["gepa"]["val_score"]
        g, a = first_reach(entries["gepa"], level), first_reach(entries["agentgrad"], level)
        calls = None if a["calls"] is None or not g["calls"] else a["calls"] / g["calls"]
        secs = None if a["seconds"] is None or not g["seconds"] else a["seconds"] / g["seconds"]
        call_ratios.append(float("inf") if calls is None else calls)
        time_ratios.append(float("inf") if secs is None else secs)
        shown = "not reached" if a["calls"] is None else f"{a['calls']} / {a['seconds']}"
        lines.append(
            f"| {results['config']['seed']} | {level:.3f} | {g['calls']} / {g['seconds']} | {shown} | "
            f"{'-' if calls is None else f'{calls:.2f}'} | {'-' if secs is None else f'{secs:.2f}'} |"
        )
    if call_ratios:
        lines += [
            "",
            f"- median AgentGrad / GEPA to GEPA's final score: calls {statistics.median(call_ratios):.2f}, "
            f"wall time {statistics.median(time_ratios):.2f}",
        ]
    return lines


def ratio_lines(rows: list[dict]) -> str:
    """Medians over seeds per optimizer, and AgentGrad's per-seed ratios to GEPA (unreached counts as inf)."""
    out = []
    by_opt: dict[str, list[dict]] = {}
    for r in rows:
        by_opt.setdefault(r["optimizer"], []).append(r)
    inf = float("inf")
    for name, rs in sorted(by_opt.items()):
        calls = [r["calls_to_target"] if r["calls_to_target"] is not None else inf for r in rs]
        secs = [r["seconds_to_target"] if r["seconds_to_target"] is not None else inf for r in rs]
        out.append(
            f"- {name}: median final val {statistics.median(r['val'] for r in rs):.3f}, "
            f"median calls to target {statistics.median(calls)}, median s to target {statistics.median(secs)}"
        )
    seeds = sorted({r["seed"] for r in rows})
    pick = {(r["seed"], r["optimizer"]): r for r in rows}
    call_ratios, time_ratios = [], []
    for s in seeds:
        a, g = pick.get((s, "agentgrad")), pick.get((s, "gepa"))
        if not a or not g:
            continue
        ac, gc = a["calls_to_target"], g["calls_to_target"]
        at, gt = a["seconds_to_target"], g["seconds_to_target"]
        call_ratios.append(inf if ac is None else (0.0 if gc is None else ac / gc))
        time_ratios.append(inf if at is None else (0.0 if gt is None else at / gt))
    if call_ratios:
        out.append(
            f"- AgentGrad / GEPA per seed: calls to target {[round(x, 2) for x in call_ratios]} "
            f"(median {statistics.median(call_ratios):.2f}), wall time to target "
            f"{[round(x, 2) for x in time_ratios]} (median {statistics.median(time_ratios):.2f})"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(prog="python -m benchmarks.synthetic.compare", description=__doc__)
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--out", required=True)
    p.add_argument("--summary-only", action="store_true")
    args = p.parse_args(own)
    from benchmarks.run import main as run_main

    out = Path(args.out)
    files = []
    for seed in [int(s) for s in args.seeds.split(",")]:
        folder = out / f"seed{seed}"
        if not args.summary_only:
            run_args = ["--bench", "synthetic", "--seed", str(seed), "--split-seed", str(seed), "--out", str(folder)]
            run_main(run_args + DEFAULT_RUN + extra)
        files.append(folder / "results.json")
    rows, table = summarize(files)
    (out / "summary.md").write_text(table + "\n")
    (out / "summary.json").write_text(json.dumps(rows, indent=1))
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
