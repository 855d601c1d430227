"""Run every optimizer variant on one zoo world, the same way: same data, simulated LMs, threads and budget.

Each variant runs through the head-to-head harness (:func:`benchmarks.harness.run_optimizer`, which counts
metric calls, task-LM calls and tokens, and times every curve point) on fresh LMs of the world, then its
program is scored on the test set. What a world's file keeps per variant is what the summary needs: scores,
totals, the best-so-far curve with its seconds and task spend, and, for AgentGrad, where its calls and wall went
(:func:`benchmarks.synthetic.profile.shares`).
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.harness import evaluate_program, run_optimizer
from benchmarks.synthetic.compare import default_budget
from benchmarks.synthetic.profile import shares
from benchmarks.zoo.stops import NoGainStop
from benchmarks.zoo.worlds import WorldSpec, build, world_lms

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Variant:
    """One optimizer setting: the harness's optimizer name, its options, and (AgentGrad only) a no-gain stop."""

    optimizer: str
    options: dict = field(default_factory=dict)
    stop_after_idle_rounds: int | None = None
    #: Cap AgentGrad's task-LM calls at this many per metric call of the budget and predictor (GEPA spends about
    #: one task call per metric call and predictor), so that reused runs cannot spend beyond the budget.
    task_calls_per_budget_call: float | None = None

    def run_options(self, budget: int, predictors: int) -> dict:
        options = dict(self.options)
        if self.stop_after_idle_rounds is not None:
            options["stop_callbacks"] = [NoGainStop(self.stop_after_idle_rounds)]  # a fresh one per run
        if self.task_calls_per_budget_call is not None:
            options["max_task_calls"] = math.ceil(self.task_calls_per_budget_call * budget * predictors)
        return {self.optimizer: options}


#: The head-to-head: AgentGrad's defaults, its paper preset, GEPA, and MIPROv2 as a cost reference.
MAIN = {
    "agentgrad": Variant("agentgrad"),
    "paper": Variant("agentgrad", {"preset": "paper"}),
    "gepa": Variant("gepa"),
    "miprov2": Variant("miprov2"),
}
#: AgentGrad with one beyond-paper mechanism off (or one setting changed) at a time, all else default.
ABLATIONS = {
    "validate_together off": Variant("agentgrad", {"validate_together": False}),
    "stack_rounds=1": Variant("agentgrad", {"stack_rounds": 1}),
    "speculate on": Variant("agentgrad", {"speculate": True}),
    "cumulative_hints off": Variant("agentgrad", {"cumulative_hints": False}),
    "reflect_hard_cases off": Variant("agentgrad", {"reflect_hard_cases": False}),
    "cluster_schedule=(3,2,1)": Variant("agentgrad", {"cluster_schedule": (3, 2, 1)}),
    "train_batch_size=8": Variant("agentgrad", {"train_batch_size": 8}),
    "train_batch_size=12": Variant("agentgrad", {"train_batch_size": 12}),
    "train_batch_size=32": Variant("agentgrad", {"train_batch_size": 32}),
    "stop after 2 idle rounds": Variant("agentgrad", stop_after_idle_rounds=2),
    "task calls capped at budget x steps": Variant("agentgrad", task_calls_per_budget_call=1.0),
    "task spend capped": Variant("agentgrad", {"cap_task_spend": True}),
    "prune_rewrites off": Variant("agentgrad", {"prune_rewrites": False}),
    "cumulative_hints=True": Variant("agentgrad", {"cumulative_hints": True}),
    "overdraft_rounds off": Variant("agentgrad", {"overdraft_rounds": None}),
    "overdraft_rounds=2": Variant("agentgrad", {"overdraft_rounds": 2}),
    "overdraft_rounds=4": Variant("agentgrad", {"overdraft_rounds": 4}),
    "val_acceptance=strict": Variant("agentgrad", {"val_acceptance": "strict"}),
    "cumulative_hints off + stack_rounds=1": Variant("agentgrad", {"cumulative_hints": False, "stack_rounds": 1}),
}
VARIANTS = {**MAIN, **ABLATIONS}


@dataclass(frozen=True)
class ZooSettings:
    """What every run of a zoo shares."""

    threads: int = 8
    train: int = 50
    val: int = 50
    test: int = 100
    task_s: float = 0.03  # simulated latency per task-LM call
    prompt_s: float = 0.08  # per prompt-LM call
    budget: int | None = None  # metric calls per run (None: 400 up to 4 steps, 600 above, as the synthetic compare)

    def budget_for(self, spec: WorldSpec) -> int:
        return self.budget or default_budget(spec.steps)


def _compact(entry: dict) -> dict:
    """What the summary reads of a harness entry (the rest, e.g. every round's record, stays out of the file)."""
    details = entry.get("details", {})
    kept = {k: entry[k] for k in ("val_score", "metric_calls", "budget", "usage", "wall_time_s", "curve")}
    series = ("curve_seconds", "curve_task_calls", "curve_task_tokens")
    kept["details"] = {k: details[k] for k in series if k in details}
    if "result" in details:
        kept["profile"] = shares(entry)
        kept["stop_reason"] = details["result"].get("stop_reason")
        kept["task_spend"] = details["result"].get("task_spend", 0.0)  # the budget's other count (calls made anew)
    return kept


def run_variant(spec: WorldSpec, name: str, settings: ZooSettings) -> dict:
    """One variant on one world: its compact entry with the test score and the seconds the test pass took."""
    variant = VARIANTS[name]
    bench = build(spec, settings.train, settings.val, settings.test)
    task_lm, prompt_lm = world_lms(spec, spec.data_seed, settings.task_s, settings.prompt_s)
    run = run_optimizer(
        variant.optimizer,
        bench.make_program(),
        bench.trainset,
        bench.valset,
        bench.metric,
        task_lm=task_lm,
        prompt_lm=prompt_lm,
        max_metric_calls=settings.budget_for(spec),
        seed=spec.data_seed,
        num_threads=settings.threads,
        hint_fn=bench.hint,
        cache_dir="off",
        options=variant.run_options(settings.budget_for(spec), spec.steps),
    )
    entry = _compact(run.to_dict())
    entry["test_score"], _calls, _scores = evaluate_program(
        run.program, bench.testset, bench.metric, task_lm=task_lm, num_threads=settings.threads
    )
    return entry


def run_world(spec: WorldSpec, names: list[str], settings: ZooSettings, out: Path) -> Path:
    """Every variant in ``names`` on ``spec``; the world's file is rewritten after each run, and a variant
    already in it is not run again (a killed zoo resumes where it stopped)."""
    path = out / "worlds" / f"world{spec.index:03d}.json"
    drawn = json.loads(json.dumps(spec.as_dict()))  # as a file holds it (lists, not tuples)
    record = json.loads(path.read_text()) if path.exists() else {"world": drawn, "runs": {}}
    if record["world"] != drawn:
        raise ValueError(f"{path} holds another world than the one drawn now; use another --out")
    record.update(label=spec.label(), noisy=spec.noisy, budget=settings.budget_for(spec))
    path.parent.mkdir(parents=True, exist_ok=True)
    for name in names:
        if name in record["runs"]:
            continue
        started = time.perf_counter()
        try:
            record["runs"][name] = run_variant(spec, name, settings)
            record.get("failed", {}).pop(name, None)  # an earlier failure of it, fixed since, is no longer news
        except Exception as exc:  # recorded, not scored: the summary leaves a failed run out and says so
            logger.exception("world %d: %s failed", spec.index, name)
            record.setdefault("failed", {})[name] = f"{type(exc).__name__}: {exc}"
        logger.info("world %d: %s done in %.1fs", spec.index, name, time.perf_counter() - started)
        path.write_text(json.dumps(record, indent=1))
    path.write_text(json.dumps(record, indent=1))
    return path
