"""Runs that must give the same ``result.json`` before and after a restructure (timing fields aside).

``python -m experiments.refactor_check.golden OUT`` writes ``OUT/<name>.json`` for the test world
(``tests/world.py``) at 1 and 4 threads and for the synthetic benchmark's seeds 0-2 (AgentGrad with its
defaults); ``python -m experiments.refactor_check.golden --compare BEFORE AFTER`` prints which differ.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import dspy

#: Keys that hold a clock reading or the temporary folder a run wrote to.
TIMING = {"started", "ended", "timestamp", "log_dir"}


def strip(obj):
    """The record without clocks and without the temporary log_dir's path."""
    if isinstance(obj, dict):
        return {k: strip(v) for k, v in obj.items() if k not in TIMING and not k.endswith(("_s", "_at", "_seconds"))}
    if isinstance(obj, list):
        return [strip(v) for v in obj]
    return obj


def world_run(threads: int, out: Path) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from dspy_agentgrad import AgentGrad
    from dspy_agentgrad.config import AgentGradConfig
    from tests.world import Pipeline, World, feedback_metric, make_data, world_lm

    dspy.configure(lm=world_lm(World()))
    train = make_data({"extract": 3, "notes": 2, "answer": 2, "either": 1, "extract+notes": 1, "none": 3})
    val = make_data({"extract": 2, "notes": 2, "answer": 1, "none": 2}, start=50)
    with tempfile.TemporaryDirectory() as log_dir:
        AgentGrad(
            feedback_metric,
            num_threads=threads,
            seed=0,
            log_dir=log_dir,
            config=AgentGradConfig.from_options(max_rounds=4, progress=False),
        ).compile(Pipeline(), trainset=train, valset=val)
        (out / f"world_t{threads}.json").write_text(Path(log_dir, "result.json").read_text())


def synthetic_run(seed: int, out: Path) -> None:
    from benchmarks.run import main as run_main

    with tempfile.TemporaryDirectory() as d:
        run_main(
            [
                "--bench",
                "synthetic",
                "--seed",
                str(seed),
                "--split-seed",
                str(seed),
                "--task-lm",
                "synthetic:0,0",
                "--optimizers",
                "agentgrad",
                "--train",
                "50",
                "--val",
                "50",
                "--test",
                "50",
                "--out",
                d,
                "--fresh",
            ]
        )
        found = sorted(Path(d).rglob("result.json"))
        if not found:
            raise SystemExit(f"no result.json under {d}")
        (out / f"synthetic_s{seed}.json").write_text(found[0].read_text())


def compare(before: Path, after: Path) -> int:
    differ = 0
    for path in sorted(before.glob("*.json")):
        a = strip(json.loads(path.read_text()))
        b = strip(json.loads((after / path.name).read_text()))
        same = a == b
        differ += not same
        print(f"{path.name}: {'identical' if same else 'DIFFERENT'} ({len(a.get('candidates', []))} candidates)")
    return 1 if differ else 0


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--compare":
        return compare(Path(argv[1]), Path(argv[2]))
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    for threads in (1, 4):
        world_run(threads, out)
    for seed in (0, 1, 2):
        synthetic_run(seed, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
