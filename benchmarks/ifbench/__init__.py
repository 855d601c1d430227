"""IFBench (test) with IFEval prompts for train/val; two-stage program of the GEPA paper, our own code."""

from __future__ import annotations

import json
from pathlib import Path

import dspy

from benchmarks.common import data_file, split_examples, trim_like_artifact
from benchmarks.ifbench.metric import constraint_fraction, constraint_results, hint
from benchmarks.ifbench.program import IFBenchTwoStage
from benchmarks.registry import Benchmark

__all__ = ["IFBenchTwoStage", "constraint_fraction", "constraint_results", "hint", "load_benchmark", "read_examples"]

IFBENCH_TEST = ("ifbench", "IFBench_test.jsonl")
IFEVAL_PROMPTS = ("ifeval", "input_data.jsonl")


def read_examples(path: Path, suite: str) -> list[dspy.Example]:
    """Rows ``key, prompt, instruction_id_list, kwargs`` as examples with input ``query``."""
    out = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if not line.strip():
                continue
            row = json.loads(line)
            kwargs = [{k: v for k, v in (kw or {}).items() if v is not None} for kw in row["kwargs"]]
            out.append(
                dspy.Example(
                    key=row["key"],
                    query=row["prompt"],
                    instruction_id_list=row["instruction_id_list"],
                    kwargs=kwargs,
                    suite=suite,
                ).with_inputs("query")
            )
    return out


def load_benchmark(
    train: int = 150,
    val: int = 300,
    test: int | None = None,
    seed: int = 0,
    test_path: Path | None = None,
    trainval_path: Path | None = None,
    split: str = "seeded",
    **_ignored,
) -> Benchmark:
    """Train/val: IFEval prompts split by ``seed``; test: IFBench test, in file order (``test=None``: all 294).

    ``split="paper"``: the GEPA paper code's cut of its train file, applied to the IFEval prompts (GEPA's
    IFBench train file is not public): val = the first 300 prompts, train = prompts 300-599 sampled down
    to 150 with ``random.Random(1)``."""
    pool = read_examples(trainval_path or data_file(*IFEVAL_PROMPTS), "ifeval")
    if split == "paper":
        valset, trainset = pool[:300], trim_like_artifact(pool[300:600], 150)
    else:
        trainset, valset = split_examples(pool, [train, val], seed)
    tests = read_examples(test_path or data_file(*IFBENCH_TEST), "ifbench")
    if test is not None:
        if test > len(tests):
            raise ValueError(f"IFBench test has {len(tests)} prompts, {test} requested")
        tests = split_examples(tests, [test], seed)[0] if test < len(tests) else tests
    info = {
        "source": "train/val: IFEval prompts (shared ifeval/input_data.jsonl); test: IFBench_test.jsonl",
        "corpus": None,
        "verifiers": "if-verifiable 0.1.2: IFBench and Google IFEval verifiers; loose variant",
        "split": "paper cut (GEPA artifact) of the IFEval prompts" if split == "paper" else f"seeded ({seed})",
        "split_seed": seed,
        "sizes": {"train": len(trainset), "val": len(valset), "test": len(tests)},
        "metric": "fraction of constraints followed (loose)",
    }
    return Benchmark("ifbench", trainset, valset, tests, IFBenchTwoStage, constraint_fraction, hint, info)
