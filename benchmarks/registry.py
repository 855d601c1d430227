"""The benchmark registry: one :class:`Benchmark` bundle per task."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import dspy

#: Split sizes of the GEPA paper (train / val / test).
PAPER_SIZES = {"train": 150, "val": 300, "test": 300}


@dataclass
class Benchmark:
    """Everything a head-to-head run needs for one task."""

    name: str
    trainset: list[dspy.Example]
    valset: list[dspy.Example]
    testset: list[dspy.Example]
    make_program: Callable[[], dspy.Module]
    metric: Callable[..., Any]
    hint: Callable[..., str | None]
    info: dict[str, Any] = field(default_factory=dict)
    #: Extra LMs the benchmark needs besides the task LM (role -> what it does), e.g. PUPA's judge.
    lm_roles: dict[str, str] = field(default_factory=dict)
    #: Gives the benchmark its extra LMs ({role: lm}) before it runs.
    bind_lms: Callable[[dict[str, Any]], None] | None = None
    #: Options the benchmark itself gives an optimizer (by name), under the run's own ``--options``.
    optimizer_options: dict[str, dict] = field(default_factory=dict)


BENCHMARKS = ("hotpotqa", "hover", "ifbench", "pupa", "math", "synthetic")


def load_benchmark(name: str, **kwargs) -> Benchmark:
    """``load_benchmark("hotpotqa", train=150, val=300, test=300, seed=0, corpus="auto")``."""
    import importlib

    if name not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {name!r}; choose from {', '.join(BENCHMARKS)}")
    return importlib.import_module(f"benchmarks.{name}").load_benchmark(**kwargs)
