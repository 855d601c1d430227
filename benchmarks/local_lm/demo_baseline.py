"""Baseline of the demo task (two-step fact extraction) with the local LM, unoptimized program.

Run:  .venv/bin/python -m benchmarks.local_lm.demo_baseline [--model gemma3-270m] [--n 10] [--split val]

Prints and writes ``demo_baseline.json``: mean score, per-example scores, seconds
per program run (DSPy cache off, 2 threads, one example at a time), token usage.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import dspy

from dspy_agentgrad.demo.task import demo_lm, load_demo_data, make_program, metric

HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--n", type=int, default=10)
    parser.add_argument("--split", default="val", choices=["train", "val", "test"])
    args = parser.parse_args()
    train, val, test = load_demo_data(seed=0)
    examples = {"train": train, "val": val, "test": test}[args.split][: args.n]
    settings = {"cache": False, "n_threads": 2}
    if args.model:
        settings["model"] = args.model
    lm = demo_lm(**settings)
    program = make_program()
    rows = []
    with dspy.context(lm=lm), dspy.track_usage() as usage:
        for ex in examples:
            start = time.perf_counter()
            pred = program(**ex.inputs())
            elapsed = time.perf_counter() - start
            result = metric(ex, pred)
            rows.append(
                {
                    "question": ex.question,
                    "gold": ex.answer,
                    "kind": ex.kind,
                    "score": result.score,
                    "seconds": round(elapsed, 2),
                    "evidence": pred.evidence[:300],
                    "answer": pred.answer[:300],
                    "feedback": result.feedback,
                }
            )
            print(f"score={result.score:.2f} {elapsed:.1f}s {ex.question} -> {pred.answer[:80]!r}", flush=True)
    out = {
        "model": lm.model,
        "split": args.split,
        "n": len(rows),
        "mean_score": round(sum(r["score"] for r in rows) / len(rows), 3),
        "seconds_per_program_run": round(sum(r["seconds"] for r in rows) / len(rows), 2),
        "tokens": usage.get_total_tokens(),
        "engine_repaired_truncations": lm.engine.repaired,
        "rows": rows,
    }
    name = f"demo_baseline_{lm.model.split('/', 1)[1].rsplit('-', 1)[0]}.json"
    (HERE / name).write_text(json.dumps(out, indent=2))
    print(json.dumps({k: v for k, v in out.items() if k != "rows"}, indent=2))


if __name__ == "__main__":
    main()
