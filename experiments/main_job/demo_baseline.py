"""Baseline of the demo task (two-step fact extraction) with the local LM, unoptimized program.

Run:  python -m experiments.main_job.demo_baseline [--model gemma3-270m] [--n 10] [--split val]
          [--str-chars 300] [--contexts 4] [--threads 2] [--tag NAME]

Prints and writes ``demo_baseline_<model>[_<tag>].json``: mean score, per-example
scores, seconds and CPU seconds per program run (DSPy cache off, one example at a
time), token usage, LM generations. ``--str-chars`` is the grammar bound of str
fields, ``--contexts`` the llama.cpp contexts kept for prompt-prefix reuse.
"""

from __future__ import annotations

import argparse
import json
import resource
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
    parser.add_argument("--str-chars", type=int, default=None, help="grammar bound of str fields (demo default)")
    parser.add_argument("--contexts", type=int, default=None, help="llama.cpp contexts (engine default)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tag", default="", help="suffix of the output file name")
    args = parser.parse_args()
    train, val, test = load_demo_data(seed=0)
    examples = {"train": train, "val": val, "test": test}[args.split][: args.n]
    settings = {"cache": False, "n_threads": args.threads}
    if args.model:
        settings["model"] = args.model
    if args.str_chars:
        from dspy_agentgrad.embedded_lm import OutputLimits

        settings["limits"] = OutputLimits(str_chars=args.str_chars)
    if args.contexts:
        settings["contexts"] = args.contexts
    lm = demo_lm(**settings)
    program = make_program()
    rows = []
    cpu = resource.getrusage(resource.RUSAGE_SELF)
    cpu_start = cpu.ru_utime + cpu.ru_stime
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
    cpu = resource.getrusage(resource.RUSAGE_SELF)
    out = {
        "model": lm.model,
        "command": "python -m experiments.main_job.demo_baseline "
        + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if v not in (None, "")),
        "split": args.split,
        "n": len(rows),
        "mean_score": round(sum(r["score"] for r in rows) / len(rows), 3),
        "seconds_per_program_run": round(sum(r["seconds"] for r in rows) / len(rows), 2),
        "cpu_seconds_per_program_run": round((cpu.ru_utime + cpu.ru_stime - cpu_start) / len(rows), 2),
        "lm_generations": lm.engine.calls,
        "tokens": usage.get_total_tokens(),
        "engine_repaired_truncations": lm.engine.repaired,
        "rows": rows,
    }
    name = f"demo_baseline_{lm.model.split('/', 1)[1].rsplit('-', 1)[0]}{'_' + args.tag if args.tag else ''}.json"
    (HERE / name).write_text(json.dumps(out, indent=2))
    print(json.dumps({k: v for k, v in out.items() if k != "rows"}, indent=2))


if __name__ == "__main__":
    main()
