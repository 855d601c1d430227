"""What did the main job's kept demonstrations change? Each held-out answer before and after, side by side.

Run:  python -m experiments.main_job.demo_changes_probe SUMMARY [--tag NAME]

SUMMARY is a ``summary.json`` the demo job wrote. The probe rebuilds the job's held-out examples, runs the
unoptimized program and the program with the job's kept demonstrations (``final_demos``) on each, and writes
``demo_changes_probe_<tag>.json``: per example the question, the gold answer, both answers and both scores. It
prints the examples whose score rose or fell, which is where to look for why a kept candidate did not show.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import dspy

from dspy_agentgrad.demo.task import demo_lm, load_demo_data, make_program, metric

HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("summary", type=Path)
    parser.add_argument("--tag", default="probe", help="suffix of the output file name")
    args = parser.parse_args()
    summary = json.loads(args.summary.read_text())
    sizes = summary["sizes"]
    _, _, held_out = load_demo_data(sizes["train"], sizes["val"], sizes["test"], summary["settings"]["seed"])
    if not summary.get("final_demos"):
        parser.error(f"{args.summary} kept no demonstrations: there is nothing to compare")
    dspy.configure_cache(enable_disk_cache=False, enable_memory_cache=True)
    before, after = make_program(), make_program()
    for name, demos in summary["final_demos"].items():
        getattr(after, name).demos = [dspy.Example(**d) for d in demos]
    rows = []
    with dspy.context(lm=demo_lm()):
        for example in held_out:
            old, new = before(**example.inputs()), after(**example.inputs())
            row = {
                "question": example.question,
                "gold": example.answer,
                "before": {"answer": old.answer, "score": metric(example, old).score},
                "after": {"answer": new.answer, "score": metric(example, new).score},
            }
            rows.append(row)
            change = row["after"]["score"] - row["before"]["score"]
            if change:
                print(
                    f"{'rose' if change > 0 else 'fell'} {row['before']['score']:.2f} -> {row['after']['score']:.2f} "
                    f"{example.question!r} gold {example.answer!r}: {old.answer[:60]!r} -> {new.answer[:60]!r}",
                    flush=True,
                )
    out = HERE / f"demo_changes_probe_{args.tag}.json"
    out.write_text(json.dumps({"summary": str(args.summary), "examples": rows}, indent=2))
    print(f"Wrote {out}")


if __name__ == "__main__":
    main()
