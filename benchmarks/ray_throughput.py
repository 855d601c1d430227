"""Throughput of program runs with a CPU-bound pure-Python tool step: Ray workers against threads.

``python -m benchmarks.ray_throughput [--runs 16] [--repeat 7] [--limit 60000] [--out FILE.json]``

The program is one predictor (an instant rule-based fake LM) followed by a tool that counts the primes below
``--limit`` in pure Python (about 0.2 s of one core): a stand-in for a local retriever, a verifier or code
execution.
Each measurement is one :meth:`Evaluator.evaluate` of ``--runs`` fresh examples (scored runs, nothing cached)
with two runs in flight (``num_threads=2``): in two threads of this process, where the GIL lets one run's
tool step go at a time, and as tasks on a local Ray cluster with two worker CPUs. A run of one thread is the
reference. The three are interleaved ``--repeat`` times, in a rotating order; min and median runs per second
are reported, and the median of each repeat's ratio of Ray to two threads (paired, so that a change in the
machine's load between repeats cancels out), and for each setup the cores its tool steps kept busy (their CPU
seconds over the wall time: near 1 at most for threads, whatever the thread count, up to 2 for two workers on an
idle machine). Needs the ``[ray]`` extra.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import dspy

from dspy_agentgrad.program.evaluation import Evaluator
from dspy_agentgrad.program.executor import RayExecutor, executor_of
from dspy_agentgrad.program.metric import Metric
from dspy_agentgrad.program.runner import ProgramRunner
from dspy_agentgrad.runtime.budget import Budget
from dspy_agentgrad.runtime.store import Memo
from dspy_agentgrad.runtime.usage import UsageLedger
from dspy_agentgrad.testing import fake_lm


def count_primes(limit: int) -> int:
    """Pure-Python CPU work that holds the GIL throughout."""
    return sum(all(n % d for d in range(2, int(n**0.5) + 1)) for n in range(2, limit))


class ToolProgram(dspy.Module):
    """A predictor picks a search range; a CPU-bound tool step computes over it."""

    limit = 60_000

    def __init__(self):
        super().__init__()
        self.plan = dspy.Predict("question -> query")

    def forward(self, question):
        query = self.plan(question=question).query
        started = time.thread_time()
        answer = str(count_primes(self.limit))
        return dspy.Prediction(answer=answer, query=query, tool_cpu_s=time.thread_time() - started)


def plan_rule(call):
    return {"query": call.inputs["question"].upper()}


def metric(gold, pred, trace=None):
    return float(pred.answer == gold.answer)


def measure(executor, threads: int, examples: list[dspy.Example]) -> tuple[float, float]:
    """Scored runs per second of one evaluation of ``examples`` (the executor's set-up excluded), and the cores
    the tool steps kept busy on average (their CPU seconds over the wall time)."""
    program = ToolProgram()
    runner = ProgramRunner(program, Metric(metric), fake_lm(plan_rule))
    evaluator = Evaluator(executor_of(executor).runs(runner), Memo(), Budget(), UsageLedger(), num_threads=threads)
    instructions = {name: p.signature.instructions for name, p in program.named_predictors()}
    started = time.perf_counter()
    outcomes = evaluator.evaluate(instructions, examples, "throughput")
    wall = time.perf_counter() - started
    assert all(o.error is None and o.score == 1.0 for o in outcomes), [o.feedback for o in outcomes]
    return len(examples) / wall, sum(o.outputs["tool_cpu_s"] for o in outcomes) / wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--limit", type=int, default=60_000)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    ToolProgram.limit = args.limit
    started = time.perf_counter()
    answer = str(count_primes(ToolProgram.limit))
    tool_s = time.perf_counter() - started
    ray_executor = RayExecutor(init_kwargs={"num_cpus": 2, "include_dashboard": False})
    setups = {"local 1 thread": ("local", 1), "local 2 threads": ("local", 2), "ray 2 workers": (ray_executor, 2)}
    batch = 0

    def examples() -> list[dspy.Example]:
        nonlocal batch
        batch += 1
        return [
            dspy.Example(question=f"batch {batch} q{i}", answer=answer).with_inputs("question")
            for i in range(args.runs)
        ]

    measure(ray_executor, 2, examples())  # warm-up: starts the cluster and its worker processes
    rates: dict[str, list[float]] = {name: [] for name in setups}
    cores: dict[str, list[float]] = {name: [] for name in setups}
    names = list(setups)
    for repeat in range(args.repeat):
        for name in names[repeat % len(names) :] + names[: repeat % len(names)]:
            executor, threads = setups[name]
            rate, busy = measure(executor, threads, examples())
            rates[name].append(rate)
            cores[name].append(busy)
    ratios = [r / t for r, t in zip(rates["ray 2 workers"], rates["local 2 threads"])]
    summary = {
        name: {
            "runs_per_s": {"min": min(r), "median": statistics.median(r), "all": [round(x, 3) for x in r]},
            "tool_cores_busy_median": statistics.median(cores[name]),
        }
        for name, r in rates.items()
    }
    summary["ray / 2 threads, per repeat (runs per s)"] = {
        "min": min(ratios),
        "median": statistics.median(ratios),
        "all": [round(x, 2) for x in ratios],
    }
    summary["settings"] = {"runs": args.runs, "repeat": args.repeat, "limit": args.limit, "tool_s": round(tool_s, 3)}
    summary["machine"] = {"cpus": os.cpu_count(), "load_average": os.getloadavg()}
    print(json.dumps(summary, indent=2))
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(summary, handle, indent=2)


if __name__ == "__main__":
    main()
