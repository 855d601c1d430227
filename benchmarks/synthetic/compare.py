"""Several seeds of the synthetic benchmark through the head-to-head runner, and tables of what reaching a score cost.

``python -m benchmarks.synthetic.compare --seeds 0,1,2 --steps 3 --reword all --out DIR [-- extra
benchmarks.run options]`` runs ``python -m benchmarks.run --bench synthetic --seed S --split-seed S --out
DIR/seedS ...`` for each seed (skip with ``--summary-only``) with ``SYNTH_PREDICTORS``, ``SYNTH_REWORD``,
``SYNTH_OVERREACH`` and ``SYNTH_HINT_RATE`` set, 8 threads and a budget of 400 metric calls (600 above 4
steps) unless the extra options say otherwise. It then prints, per seed and optimizer, the final validation
and test scores, the totals spent, and what each optimizer had spent (metric calls, task-LM calls, task-LM
tokens, wall seconds) when its best validation score first reached two levels: GEPA's final validation score
of that seed (how fast each gets where GEPA ends) and 90% of the best final validation score of the seed (a
common target, :mod:`benchmarks.speed`). Medians over seeds follow, with AgentGrad/GEPA ratios per seed (a
level AgentGrad never reaches counts as inf; one only GEPA misses as 0). "Equal budget" is equal metric calls;
the task-LM columns say what that bought.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

from benchmarks.speed import TARGET_FRACTION, first_reach

DEFAULT_RUN = [
    "--task-lm",
    "synthetic",
    "--optimizers",
    "baseline,agentgrad,gepa",
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
#: What reaching a level is measured in: the key in :func:`benchmarks.speed.first_reach`, the column title.
SPEND = (("calls", "metric calls"), ("task_calls", "task-LM calls"), ("task_tokens", "task tokens"), ("seconds", "s"))
LEVELS = (("gepa_final", "GEPA's final val"), ("target", f"{TARGET_FRACTION:.0%} of best"))


def default_budget(steps: int) -> int:
    return 400 if steps <= 4 else 600


def rows_of(path: Path, reference: Path | None = None) -> list[dict]:
    """One row per optimizer of one seed's results: scores, totals, and the spend to reach each level.
    ``reference``: another run of the same seed whose optimizers fill in those missing from ``path``."""
    results = json.loads(path.read_text())
    entries = {n: e for n, e in results["benchmarks"]["synthetic"]["optimizers"].items() if n != "baseline"}
    if reference is not None:
        other = json.loads(reference.read_text())
        if other["config"]["seed"] != results["config"]["seed"]:
            raise ValueError(f"{reference} is another seed than {path}")
        for name, entry in other["benchmarks"]["synthetic"]["optimizers"].items():
            if name != "baseline":
                entries.setdefault(name, entry)
    entries = {n: e for n, e in entries.items() if e.get("status", "done") == "done"}
    finals = [e["val_score"] for e in entries.values() if e.get("val_score") is not None]
    levels = {"target": TARGET_FRACTION * max(finals, default=0.0)}
    if "gepa" in entries:
        levels["gepa_final"] = entries["gepa"]["val_score"]
    rows = []
    for name, e in entries.items():
        usage = e.get("usage", {})
        task = usage.get("task", {})
        row = {
            "seed": results["config"]["seed"],
            "optimizer": name,
            "val": e["val_score"],
            "test": e.get("test_score"),
            "metric_calls": e["metric_calls"],
            "task_calls": task.get("calls", 0),
            "task_tokens": task.get("prompt_tokens", 0) + task.get("completion_tokens", 0),
            "prompt_calls": usage.get("prompt", {}).get("calls", 0),
            "wall_s": e["wall_time_s"],
            "levels": {key: level for key, level in levels.items()},
        }
        for key, level in levels.items():
            row[key] = first_reach(e, level)
        rows.append(row)
    return rows


def _cell(value) -> str:
    if value is None:
        return "–"
    return f"{value:.1f}" if isinstance(value, float) else str(value)


def seed_table(rows: list[dict]) -> list[str]:
    head = ["seed", "optimizer", "final val", "test", "metric calls", "task-LM calls", "task tokens", "prompt calls"]
    head += ["wall s"] + [f"{title}: {unit}" for key, title in LEVELS for _, unit in SPEND]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in sorted(rows, key=lambda r: (r["seed"], r["optimizer"])):
        cells = [r["seed"], r["optimizer"], f"{r['val']:.3f}", f"{r['test']:.3f}", r["metric_calls"]]
        cells += [r["task_calls"], r["task_tokens"], r["prompt_calls"], f"{r['wall_s']:.1f}"]
        for key, _ in LEVELS:
            hit = r.get(key) or {}
            reached = hit.get("calls") is not None
            cells += [_cell(hit.get(k)) if reached else "not reached" if k == "calls" else "–" for k, _ in SPEND]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return lines


def median_lines(rows: list[dict]) -> list[str]:
    """Per optimizer: median final val/test and totals; AgentGrad/GEPA ratios per seed at each level."""
    inf = float("inf")
    by_opt: dict[str, list[dict]] = {}
    for r in rows:
        by_opt.setdefault(r["optimizer"], []).append(r)
    lines = [
        "| optimizer | seeds | median final val | median test | min final val | median metric calls | "
        "median task-LM calls | median task tokens | median wall s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, rs in sorted(by_opt.items()):
        med = {k: statistics.median(r[k] for r in rs) for k in ("val", "test", "metric_calls", "task_calls")}
        med |= {k: statistics.median(r[k] for r in rs) for k in ("task_tokens", "wall_s")}
        lines.append(
            f"| {name} | {len(rs)} | {med['val']:.3f} | {med['test']:.3f} | {min(r['val'] for r in rs):.3f} | "
            f"{med['metric_calls']:.0f} | {med['task_calls']:.0f} | {med['task_tokens']:.0f} | {med['wall_s']:.1f} |"
        )
    pick = {(r["seed"], r["optimizer"]): r for r in rows}
    seeds = sorted({r["seed"] for r in rows if (r["seed"], "agentgrad") in pick and (r["seed"], "gepa") in pick})
    if not seeds:
        return lines
    lines += ["", "AgentGrad / GEPA, per seed (median):", ""]
    lines += ["| level | " + " | ".join(unit for _, unit in SPEND) + " |", "|---|" + "---|" * len(SPEND)]
    for key, title in LEVELS:
        cells = []
        for k, _ in SPEND:
            ratios = []
            for s in seeds:
                a, g = pick[s, "agentgrad"].get(key) or {}, pick[s, "gepa"].get(key) or {}
                av, gv = a.get(k), g.get(k)
                ratios.append(inf if av is None else 0.0 if not gv else av / gv)
            cells.append(f"{[round(x, 2) for x in ratios]} ({statistics.median(ratios):.2f})")
        lines.append(f"| {title} | " + " | ".join(cells) + " |")
    a_vals = [pick[s, "agentgrad"]["val"] for s in seeds]
    g_vals = [pick[s, "gepa"]["val"] for s in seeds]
    g_tests = [pick[s, "gepa"]["test"] for s in seeds]
    lines += [
        "",
        f"- final val AgentGrad >= GEPA in {sum(a >= g for a, g in zip(a_vals, g_vals))} of {len(seeds)} seeds; "
        f"AgentGrad test median {statistics.median(pick[s, 'agentgrad']['test'] for s in seeds):.3f} vs GEPA "
        f"{statistics.median(g_tests):.3f}",
    ]
    return lines


def summarize(files: list[Path], references: list[Path] | None = None) -> tuple[list[dict], str]:
    rows = [row for path, ref in zip(files, references or [None] * len(files)) for row in rows_of(path, ref)]
    lines = median_lines(rows) + ["", "Per seed:", ""] + seed_table(rows)
    return rows, "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(prog="python -m benchmarks.synthetic.compare", description=__doc__)
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--steps", type=int, default=int(os.environ.get("SYNTH_PREDICTORS", 4)))
    p.add_argument("--reword", default=os.environ.get("SYNTH_REWORD", "repeat"))
    p.add_argument(
        "--overreach",
        default=os.environ.get("SYNTH_OVERREACH", "0"),
        help="the share of defects whose fix also breaks other examples (SYNTH_OVERREACH)",
    )
    p.add_argument(
        "--hint-rate",
        help="the share of (example, step) pairs where a hinted faulty step follows its hint (SYNTH_HINT_RATE; "
        "the world's default when unset)",
    )
    p.add_argument("--out", required=True)
    p.add_argument("--summary-only", action="store_true")
    p.add_argument(
        "--reference",
        help="a compare folder of the same seeds whose optimizers complete the tables (e.g. GEPA's runs, "
        "when only AgentGrad is run again with --optimizers baseline,agentgrad)",
    )
    args = p.parse_args(own)
    os.environ["SYNTH_PREDICTORS"], os.environ["SYNTH_REWORD"] = str(args.steps), args.reword
    os.environ["SYNTH_OVERREACH"] = args.overreach
    if args.hint_rate is not None:
        os.environ["SYNTH_HINT_RATE"] = args.hint_rate
    from benchmarks.run import main as run_main
    from benchmarks.synthetic import hint_rate, overreach_share, reword_mode

    reword_mode()  # a bad mode or share fails here, before any run
    overreach_share()
    rate = hint_rate()
    budget = [] if "--max-metric-calls" in extra else ["--max-metric-calls", str(default_budget(args.steps))]
    out = Path(args.out)
    files = []
    for seed in [int(s) for s in args.seeds.split(",")]:
        folder = out / f"seed{seed}"
        if not args.summary_only:
            run_args = ["--bench", "synthetic", "--seed", str(seed), "--split-seed", str(seed), "--out", str(folder)]
            run_main(run_args + DEFAULT_RUN + budget + extra)
        files.append(folder / "results.json")
    references = None
    if args.reference:
        references = [Path(args.reference) / f.parent.name / "results.json" for f in files]
    rows, table = summarize(files, references)
    header = f"steps {args.steps}, reword {args.reword}, overreach {args.overreach}, hint rate {rate:g}"
    header += f", seeds {args.seeds}"
    header += f" (other optimizers from {args.reference})\n\n" if args.reference else "\n\n"
    (out / "summary.md").write_text(header + table + "\n")
    (out / "summary.json").write_text(json.dumps(rows, indent=1))
    print(header + table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
