"""Overhead and scale of AgentGrad's orchestration, on the synthetic benchmark (a script, not a test).

``python -m benchmarks.overhead [--quick] [--out FILE.json]`` measures:

* CPU per metric call: process CPU time (all threads) of an AgentGrad run with an instant simulated LM,
  divided by its metric calls, without and with ``log_dir``; GEPA the same way for reference.
* Scale: peak resident memory and journal size (bytes under ``log_dir``) at budgets 500 / 2000 / 6871
  with 300 validation examples, each run in a fresh subprocess so that peaks do not carry over.
* LM share: with 30 ms per task call and 80 ms per prompt call, the share of wall time during which at
  least one LM call is in flight, and the mean number in flight, at 1 and 8 threads.

Numbers depend on the machine and its load: run it on an idle machine, and say the load otherwise.
On a shared 2-core machine one run's CPU per metric call varies by 10-15% from run to run, as much as
what ``log_dir`` costs, so the CPU and 8-thread LM-share runs are repeated (``--repeat``, interleaved)
and ``summary`` holds their medians.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import dspy

from benchmarks.harness import run_optimizer
from benchmarks.synthetic import load_benchmark
from benchmarks.synthetic.world import SyntheticWorld
from dspy_agentgrad.testing import fake_lm

BUDGETS = (500, 2000, 6871)


class TimedWorld(SyntheticWorld):
    """The synthetic world, recording when each LM call starts and ends."""

    def __init__(self, task_s: float, prompt_s: float):
        super().__init__(task_s, prompt_s)
        self.spans: list[tuple[float, float]] = []
        self._spans_lock = threading.Lock()

    def __call__(self, call):
        start = time.perf_counter()
        try:
            return super().__call__(call)
        finally:
            with self._spans_lock:
                self.spans.append((start, time.perf_counter()))


def in_flight(spans: list[tuple[float, float]], start: float, end: float) -> tuple[float, float]:
    """(share of [start, end] with at least one call in flight, mean calls in flight)."""
    covered, reach = 0.0, start
    for s, e in sorted(spans):
        s, e = max(s, reach), min(e, end)
        if e > s:
            covered += e - s
            reach = e
    wall = max(end - start, 1e-9)
    return covered / wall, sum(e - s for s, e in spans) / wall


def one_run(
    optimizer: str,
    budget: int,
    train: int,
    val: int,
    threads: int,
    task_ms: float,
    prompt_ms: float,
    log_dir: str | None,
) -> dict[str, Any]:
    bench = load_benchmark(train=train, val=val, test=1, seed=0)
    world = TimedWorld(task_ms / 1000, prompt_ms / 1000)
    lm = fake_lm(world, name="fake/synthetic")
    cpu0, wall0 = time.process_time(), time.perf_counter()
    run = run_optimizer(
        optimizer,
        bench.make_program(),
        bench.trainset,
        bench.valset,
        bench.metric,
        task_lm=lm,
        prompt_lm=lm.copy(),
        max_metric_calls=budget,
        seed=0,
        num_threads=threads,
        hint_fn=bench.hint,
        log_dir=log_dir,
        cache_dir="off",
        options={"gepa": {"use_merge": False}} if optimizer == "gepa" else {},
    )
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    share, mean = in_flight(world.spans, wall0, wall0 + wall)
    journal = sum(p.stat().st_size for p in Path(log_dir).rglob("*") if p.is_file()) if log_dir else 0
    return {
        "optimizer": optimizer,
        "budget": budget,
        "metric_calls": run.metric_calls,
        "val_examples": val,
        "val": run.val_score,
        "threads": threads,
        "latency_ms": [task_ms, prompt_ms],
        "log_dir": bool(log_dir),
        "wall_s": round(wall, 3),
        "cpu_s": round(cpu, 3),
        "cpu_ms_per_metric_call": round(1000 * cpu / max(run.metric_calls, 1), 3),
        "lm_calls": len(world.spans),
        "share_of_wall_in_lm_calls": round(share, 4),
        "mean_lm_calls_in_flight": round(mean, 2),
        "journal_bytes": journal,
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def in_subprocess(**kwargs: Any) -> dict[str, Any]:
    """``one_run`` in a fresh interpreter (clean peak memory)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))}
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.overhead", "--one", json.dumps(kwargs)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the repeated runs: CPU per metric call by configuration, ``log_dir``'s relative CPU
    cost, the 8-thread LM share; and the peak memory of the largest-budget run."""
    cpu: dict[str, list[float]] = {}
    for r in rows:
        if r["latency_ms"] == [0.0, 0.0] and r["val_examples"] == 50:  # the CPU runs, not the scale runs
            name = r["optimizer"] + (" + log_dir" if r["log_dir"] else "")
            cpu.setdefault(name, []).append(r["cpu_ms_per_metric_call"])
    medians = {name: statistics.median(values) for name, values in cpu.items()}
    shares = [r["share_of_wall_in_lm_calls"] for r in rows if r["latency_ms"] != [0.0, 0.0] and r["threads"] == 8]
    largest = max((r for r in rows if r["log_dir"] and r["optimizer"] == "agentgrad"), key=lambda r: r["budget"])
    return {
        "cpu_ms_per_metric_call_median": medians,
        "cpu_ms_per_metric_call_runs": cpu,
        "log_dir_cpu_overhead_median": round(medians["agentgrad + log_dir"] / medians["agentgrad"] - 1, 4),
        "share_of_wall_in_lm_calls_8_threads_median": statistics.median(shares),
        "share_of_wall_in_lm_calls_8_threads_runs": shares,
        f"peak_rss_mb_budget_{largest['budget']}": largest["peak_rss_mb"],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.overhead", description=__doc__)
    p.add_argument("--quick", action="store_true", help="small budgets only (a smoke run)")
    p.add_argument("--out", default=None, help="write the measurements here as JSON")
    p.add_argument("--repeat", type=int, default=None, help="runs of each CPU and 8-thread LM-share run (default 5/3)")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    logging.disable(logging.WARNING)
    dspy.disable_logging()
    if args.one:
        kwargs = json.loads(args.one)
        with tempfile.TemporaryDirectory() as tmp:
            kwargs["log_dir"] = tmp if kwargs.pop("with_log_dir") else None
            print(json.dumps(one_run(**kwargs)))
        return 0
    budgets = (500,) if args.quick else BUDGETS
    repeat = args.repeat or (3 if args.quick else 5)
    rows = []
    base = dict(train=150, val=50, threads=8, task_ms=0.0, prompt_ms=0.0)
    for _ in range(repeat):  # interleaved, so that a change in the machine's load hits every configuration
        for optimizer, with_log in (("agentgrad", False), ("agentgrad", True), ("gepa", False)):
            rows.append(in_subprocess(optimizer=optimizer, budget=500, with_log_dir=with_log, **base))
    for budget in budgets:
        rows.append(in_subprocess(optimizer="agentgrad", budget=budget, with_log_dir=True, **{**base, "val": 300}))
    for threads in (1,) + (8,) * repeat:
        rows.append(
            in_subprocess(
                optimizer="agentgrad",
                budget=300 if args.quick else 500,
                with_log_dir=False,
                **{**base, "threads": threads, "task_ms": 30.0, "prompt_ms": 80.0},
            )
        )
    load = os.getloadavg()
    report = {"load_average": load, "cpus": os.cpu_count(), "repeat": repeat, "summary": summarize(rows), "runs": rows}
    text = json.dumps(report, indent=1)
    if args.out:
        Path(args.out).write_text(text)
    keys = (
        "optimizer",
        "budget",
        "metric_calls",
        "threads",
        "latency_ms",
        "log_dir",
        "wall_s",
        "cpu_ms_per_metric_call",
    )
    more = ("share_of_wall_in_lm_calls", "mean_lm_calls_in_flight", "journal_bytes", "peak_rss_mb")
    print(f"load average {load}, {os.cpu_count()} CPUs")
    print(json.dumps(report["summary"], indent=1))
    print(" | ".join(keys + more))
    for row in rows:
        print(" | ".join(str(row[k]) for k in keys + more))
    return 0


if __name__ == "__main__":
    sys.exit(main())
