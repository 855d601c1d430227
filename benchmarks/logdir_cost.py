"""What ``log_dir`` costs: CPU per metric call and journal bytes per metric call, with an instant fake LM.

``python -m benchmarks.logdir_cost --budget 1500 --train 50 --val 100``

Runs AgentGrad on the HotpotQA program (pooled offline passages, so runs carry real retrieved text)
with the rule-based fake LM (no latency), once without and once with ``log_dir``, and prints the
process CPU time per metric call, the relative overhead of ``log_dir``, the journal's size per
metric call, the number of fsync calls, and the size of ``state.json``. A resumed run (everything
replayed from the journal) is timed too. Not a timed test: numbers depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import dspy

from benchmarks.fake_world import BenchWorld
from benchmarks.registry import load_benchmark
from dspy_agentgrad import AgentGrad
from dspy_agentgrad.config import AgentGradConfig
from dspy_agentgrad.testing import fake_lm


class FsyncCounter:
    """Counts ``os.fsync`` calls while installed."""

    def __init__(self):
        self.calls = 0
        self._real = os.fsync

    def __enter__(self):
        def counted(fd):
            self.calls += 1
            return self._real(fd)

        os.fsync = counted
        return self

    def __exit__(self, *exc):
        os.fsync = self._real


def run_once(bench, budget: int, log_dir: Path | None, threads: int) -> dict:
    world = BenchWorld(bench.trainset + bench.valset, easy_every=4)
    dspy.configure(lm=fake_lm(world))
    optimizer = AgentGrad(
        bench.metric,
        auto=None,
        max_metric_calls=budget,
        hint_fn=bench.hint,
        num_threads=threads,
        log_dir=log_dir,
        config=AgentGradConfig.from_options(progress=False),
    )
    with FsyncCounter() as fsyncs:
        cpu, wall = time.process_time(), time.perf_counter()
        result = optimizer.compile(bench.make_program(), trainset=bench.trainset, valset=bench.valset).detailed_results
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    out = {
        "metric_calls": result.metric_calls,
        "cpu_s": round(cpu, 3),
        "wall_s": round(wall, 3),
        "cpu_ms_per_metric_call": round(1000 * cpu / max(1, result.metric_calls), 3),
        "fsyncs": fsyncs.calls,
    }
    if log_dir is not None:
        journal = log_dir / "memo.jsonl"
        out["journal_bytes"] = journal.stat().st_size
        out["journal_bytes_per_metric_call"] = round(journal.stat().st_size / max(1, result.metric_calls))
        state = log_dir / "state.json"
        out["state_json_bytes"] = state.stat().st_size if state.exists() else 0
    return out


def _median(runs: list[dict]) -> dict:
    ordered = sorted(runs, key=lambda r: r["cpu_s"])
    return {**ordered[len(ordered) // 2], "cpu_s_all_runs": [r["cpu_s"] for r in runs]}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.logdir_cost", description=__doc__)
    p.add_argument("--budget", type=int, default=1500)
    p.add_argument("--train", type=int, default=50)
    p.add_argument("--val", type=int, default=100)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeat", type=int, default=3, help="runs per setting; the run with the median CPU time is shown")
    args = p.parse_args(argv)
    bench = load_benchmark("hotpotqa", train=args.train, val=args.val, test=1, seed=0, corpus="pooled")
    report = {"settings": vars(args)}
    plain, logged, resumed = [], [], []
    for _ in range(args.repeat):
        plain.append(run_once(bench, args.budget, None, args.threads))
        with tempfile.TemporaryDirectory() as tmp:
            logged.append(run_once(bench, args.budget, Path(tmp) / "log", args.threads))
            resumed.append(run_once(bench, args.budget, Path(tmp) / "log", args.threads))
    report["without_log_dir"], report["with_log_dir"], report["resumed_from_journal"] = map(
        _median, (plain, logged, resumed)
    )
    base, logged = report["without_log_dir"]["cpu_s"], report["with_log_dir"]["cpu_s"]
    report["log_dir_cpu_overhead"] = f"{100 * (logged - base) / base:+.1f}%"
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
