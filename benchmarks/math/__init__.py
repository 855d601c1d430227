"""MATH benchmark: competition problems solved by a solve -> verify program, scored with math-verify."""

from __future__ import annotations

from benchmarks.common import split_examples
from benchmarks.math.data import load_problems
from benchmarks.math.metric import answers_match, hint, math_metric, require_math_verify
from benchmarks.math.program import SolveThenVerify
from benchmarks.registry import Benchmark

__all__ = ["SolveThenVerify", "answers_match", "load_benchmark", "load_problems", "math_metric"]

SOURCES = {
    "offline": "the offline fixture (30 problems written for the tests, not from MATH)",
    "online": "MATH-500 (Hugging Face HuggingFaceH4/MATH-500, test.jsonl)",
}


def load_benchmark(
    train: int = 150, val: int = 300, test: int | None = 300, seed: int = 0, source: str = "offline", **_ignored
) -> Benchmark:
    """Disjoint train/val/test drawn from the problems of ``source``, shuffled with ``seed``."""
    require_math_verify()
    problems = load_problems(source)
    test = 300 if test is None else test
    try:
        trainset, valset, testset = split_examples(problems, [train, val, test], seed)
    except ValueError as exc:
        raise ValueError(
            f"MATH ({SOURCES[source]}): {exc}; pass smaller --train/--val/--test"
            + (" or --source online" if source == "offline" else "")
        ) from None
    info = {
        "source": SOURCES[source],
        "corpus": None,
        "split": f"seeded ({seed})",
        "split_seed": seed,
        "sizes": {"train": len(trainset), "val": len(valset), "test": len(testset)},
        "metric": "final answer equal to the reference answer (math-verify)",
    }
    return Benchmark("math", trainset, valset, testset, SolveThenVerify, math_metric, hint, info)
