"""Do the main job's demonstration candidates generalize? Each one scored on more held-out examples than the job has.

Run:  python -m experiments.main_job.demo_candidates_probe SUMMARY [SUMMARY ...] [--n 24] [--tag NAME]
      [--predictor NAME]

SUMMARY is a ``summary.json`` the demo job wrote (``python -m dspy_agentgrad demo``); several must share a seed and
sizes (runs of different versions on the same data). The probe rebuilds that data with ``--n`` held-out examples
instead of the job's few; the first of them are the job's own held-out examples. It scores the unoptimized program
and, for every demonstration candidate the jobs judged (of ``--predictor`` only, if given), the program with that
candidate's demonstrations alone, and writes ``demo_candidates_probe_<tag>.json``: per-example scores, the mean,
and the change against the unoptimized program (gain, wins, losses, standard error). The job keeps the DSPy cache
in memory only, so a step whose prompt did not change is not generated twice.
"""

from __future__ import annotations

import argparse
import json
import resource
from pathlib import Path

import dspy

from dspy_agentgrad.demo.task import demo_lm, load_demo_data, make_program, metric
from dspy_agentgrad.reporting.paired import PairedChange

HERE = Path(__file__).resolve().parent


def scores(demos: dict[str, list[dict]], examples: list[dspy.Example]) -> list[float]:
    """Per-example scores of the unoptimized program with ``demos`` (predictor name -> demonstrations) set."""
    program = make_program()
    for name, shown in demos.items():
        getattr(program, name).demos = [dspy.Example(**d) for d in shown]
    return [metric(ex, program(**ex.inputs())).score for ex in examples]


def condition_row(s: list[float], base: list[float], job_n: int) -> dict:
    """One condition's means (all, the job's held-out, the others) and its change against ``base``."""
    return {
        "mean": round(sum(s) / len(s), 3),
        "mean_on_the_jobs_held_out": round(sum(s[:job_n]) / job_n, 3),
        "mean_on_the_others": round(sum(s[job_n:]) / max(len(s) - job_n, 1), 3),
        **PairedChange.of(base, s).as_dict(),
        "scores": s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("summary", type=Path, nargs="+")
    parser.add_argument("--n", type=int, default=24, help="held-out examples (the job's come first)")
    parser.add_argument("--tag", default="probe", help="suffix of the output file name")
    parser.add_argument("--predictor", default=None, help="score only this predictor's candidates")
    args = parser.parse_args()
    summaries = {path: json.loads(path.read_text()) for path in args.summary}
    runs = {
        (s["sizes"]["train"], s["sizes"]["val"], s["sizes"]["test"], s["settings"]["seed"]) for s in summaries.values()
    }
    if len(runs) != 1:
        parser.error(f"the summaries must share sizes and seed; they hold {sorted(runs)}")
    summary = next(iter(summaries.values()))
    sizes, seed = summary["sizes"], summary["settings"]["seed"]
    _, _, held_out = load_demo_data(sizes["train"], sizes["val"], args.n, seed)
    dspy.configure_cache(enable_disk_cache=False, enable_memory_cache=True)
    conditions = {"unoptimized": {}}
    for path, run in summaries.items():
        for c in run["candidates"]:
            shown = {c["predictor"]: c.get("demos")}
            if c.get("kind") != "demos" or not c.get("demos") or args.predictor not in (None, c["predictor"]):
                continue
            if shown in conditions.values():
                continue  # another summary holds the same candidate
            label = f"round {c['round']} {c['predictor']} ({'kept' if c['accepted'] else 'rejected'})"
            conditions[f"{path}: {label}" if len(summaries) > 1 else label] = shown
    rows = {}
    with dspy.context(lm=demo_lm()):
        for label, demos in conditions.items():
            rows[label] = scores(demos, held_out)
            print(f"{label}: mean {sum(rows[label]) / len(held_out):.3f} over {len(held_out)}", flush=True)
    base = rows["unoptimized"]
    job_n = sizes["test"]
    out = {
        "summaries": [str(path) for path in args.summary],
        "seed": seed,
        "held_out": len(held_out),
        "job_held_out": job_n,
        "conditions": {label: condition_row(s, base, job_n) for label, s in rows.items()},
        "cpu_s": round(sum(resource.getrusage(resource.RUSAGE_SELF)[:2]), 1),
    }
    (HERE / f"demo_candidates_probe_{args.tag}.json").write_text(json.dumps(out, indent=2))
    for label, row in out["conditions"].items():
        print(label, {k: v for k, v in row.items() if k != "scores"})


if __name__ == "__main__":
    main()
