"""Would answer-step demonstrations from the whole training batch, not one cluster of failures, help the main job?

Run:  python -m experiments.main_job.batch_demos_probe [--seeds 0,1,2] [--n 24]

For each seed it rebuilds the main job's data (6 training, 6 validation examples) with ``--n`` held-out examples (the
job's 8 first). It runs the unoptimized ``locate`` step on the 6 training examples. Each example whose located
evidence holds the gold answer becomes an ``answer`` demonstration: its question and evidence, with the gold
answer. These are the labels the job's hint reveals, taken from every training example, not only the attributed
failures. The program with the first three of them is scored against the unoptimized program on validation and
held-out. The output is ``batch_demos_probe.json``. The job keeps DSPy's cache in memory only.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import dspy

from dspy_agentgrad.demo.task import demo_lm, load_demo_data, make_program, metric, shows_answer

HERE = Path(__file__).resolve().parent


def scores(demos: list[dict], examples: list[dspy.Example]) -> list[float]:
    """Per-example scores of the unoptimized program with ``demos`` on its ``answer`` step."""
    program = make_program()
    program.answer.demos = [dspy.Example(**d) for d in demos]
    return [metric(ex, program(**ex.inputs())).score for ex in examples]


def mean(values: list[float]) -> float:
    return round(sum(values) / len(values), 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--n", type=int, default=24, help="held-out examples (the job's 8 come first)")
    args = parser.parse_args()
    dspy.configure_cache(enable_disk_cache=False, enable_memory_cache=True)
    out = {}
    for seed in [int(s) for s in args.seeds.split(",")]:
        start = time.time()
        train, val, held_out = load_demo_data(6, 6, args.n, seed)
        with dspy.context(lm=demo_lm()):
            locate = make_program().locate
            demos = []
            for ex in train:
                evidence = locate(passage=ex.passage, question=ex.question).evidence
                if shows_answer(ex, evidence):
                    demos.append({"evidence": evidence, "question": ex.question, "answer": ex.answer})
            base, shown = scores([], held_out), scores(demos[:3], held_out)
            val_base, val_shown = scores([], val), scores(demos[:3], val)
        out[seed] = {
            "demonstrations": len(demos),
            "questions": [d["question"] for d in demos[:3]],
            "validation": [mean(val_base), mean(val_shown)],
            "held_out": [mean(base), mean(shown)],
            "the_jobs_held_out": [mean(base[:8]), mean(shown[:8])],
            "wins": sum(a > b for a, b in zip(shown, base)),
            "losses": sum(a < b for a, b in zip(shown, base)),
            "wall_s": round(time.time() - start),
        }
        print(seed, out[seed], flush=True)
    (HERE / "batch_demos_probe.json").write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
