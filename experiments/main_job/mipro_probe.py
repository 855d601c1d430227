"""MIPROv2 on the main job's task and model: the demo-bootstrapping reference for demonstration candidates.

Run:  .venv/bin/python -m experiments.main_job.mipro_probe --seeds 0,1,2  [--trials 4 --candidates 3]

The same data as ``python -m dspy_agentgrad demo --seed S`` (8 train, 12 validation, 24 held-out), the same
embedded SmolLM2-135M as task and prompt LM, and the same metric (token F1). MIPROv2 bootstraps up to 3
demonstrations per step from training runs the metric scores above zero (its default threshold), proposes
instructions with the same small model and searches the pairs on the 12 validation examples. Writes
``mipro_probe.json`` next to this file: held-out before and after, validation, metric calls, wall, and what
the optimized program holds.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import dspy

from dspy_agentgrad.demo.job import evaluate, mean
from dspy_agentgrad.demo.task import demo_lm, load_demo_data, make_program, metric

HERE = Path(__file__).resolve().parent


def run_seed(seed: int, trials: int, candidates: int) -> dict:
    """MIPROv2 on one seed of the job's data; the summary of what it did."""
    train, val, held_out = load_demo_data(8, 12, 24, seed)
    calls = {"n": 0}

    def counted(example: dspy.Example, pred: dspy.Prediction, trace: object = None) -> float:
        calls["n"] += 1
        return metric(example, pred).score

    lm = demo_lm()
    start = time.time()
    with dspy.context(lm=lm):
        program = make_program()
        baseline = mean(evaluate(program, held_out, num_threads=1)[0])
        compiling = time.time()
        optimizer = dspy.MIPROv2(
            counted,
            prompt_model=lm,
            task_model=lm,
            auto=None,
            num_candidates=candidates,
            max_bootstrapped_demos=3,
            max_labeled_demos=0,
            num_threads=1,
            seed=seed + 9,  # MIPROv2 treats 0 as unset; its default is 9
        )
        optimized = optimizer.compile(program, trainset=train, valset=val, num_trials=trials, minibatch=False)
        optimizer_wall = time.time() - compiling
        after = mean(evaluate(optimized, held_out, num_threads=1)[0])
    return {
        "held_out": [baseline, after],
        "validation_best": getattr(optimized, "score", None),
        "metric_calls": calls["n"],
        "optimizer_wall_s": round(optimizer_wall),
        "wall_s": round(time.time() - start),
        "demos": {name: len(p.demos) for name, p in optimized.named_predictors()},
        "instructions": {name: p.signature.instructions for name, p in optimized.named_predictors()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--trials", type=int, default=4)
    parser.add_argument("--candidates", type=int, default=3)
    args = parser.parse_args()
    dspy.configure_cache(enable_disk_cache=False, enable_memory_cache=True)
    out = {}
    for seed in [int(s) for s in args.seeds.split(",")]:
        out[seed] = run_seed(seed, args.trials, args.candidates)
        print(seed, json.dumps(out[seed])[:600], flush=True)
        (HERE / "mipro_probe.json").write_text(json.dumps(out, indent=2))  # after every seed: a cut run keeps them


if __name__ == "__main__":
    main()
