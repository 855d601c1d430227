"""The head-to-head harness: one function that runs any of the compared optimizers the same way.

``run_optimizer(name, program, trainset, valset, metric, task_lm=..., prompt_lm=..., max_metric_calls=N,
seed=..., num_threads=..., hint_fn=..., log_dir=...)`` returns an :class:`OptimizerRun` with the
optimized program, its validation score, the metric calls it really made (counted by wrapping the
metric), task/prompt LM calls and tokens (counted on the LM instances), wall time, the instructions
per predictor and a curve of best validation score against metric calls.

Budgets: one metric call = one program run + metric on one example (GEPA's unit). AgentGrad and
GEPA take ``max_metric_calls`` directly; MIPROv2 has no such option, so :func:`mipro_plan` chooses its
number of candidates, trials and minibatch size so that its expected calls (bootstrapping, the
default program's full evaluation, minibatch trials and periodic full evaluations) fit the budget.
TextGrad (:mod:`benchmarks.tgd`) takes steps while a minibatch and a validation pass still fit the budget.
Every optimizer's real count is reported (``metric_calls``), whatever it was told.
"""

from __future__ import annotations

import inspect
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dspy

from benchmarks.lms import UsageMeter
from benchmarks.segments import SegmentLog

logger = logging.getLogger(__name__)

#: AgentGrad with some of its three components switched off: the rows of the paper's ablation table.
ABLATION = {
    "agentgrad-plain": {"target_identification": False, "agent_supervision": False, "semantic_abstraction": False},
    "agentgrad+target": {"target_identification": True, "agent_supervision": False, "semantic_abstraction": False},
    "agentgrad+supervision": {"target_identification": True, "agent_supervision": True, "semantic_abstraction": False},
}
OPTIMIZERS = ("baseline", "agentgrad", "gepa", "miprov2", "textgrad", *ABLATION)


# ---------------------------------------------------------------------------------------------
# metric wrappers
# ---------------------------------------------------------------------------------------------
def _takes_gepa_args(fn: Callable) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return any(p.kind is p.VAR_KEYWORD for p in params.values()) or "pred_name" in params


def score_of(value: Any) -> float:
    """The number inside a metric result (float, bool, ``dspy.Prediction(score=...)`` or dict)."""
    if isinstance(value, dict):
        value = value.get("score", 0.0)
    elif not isinstance(value, (bool, int, float)) and hasattr(value, "score"):
        value = value.score
    try:
        out = float(value)
    except (TypeError, ValueError):
        return 0.0
    return out if math.isfinite(out) else 0.0


class CountingMetric:
    """Thread-safe counter around a metric; exposes GEPA's 5-argument protocol.

    ``calls`` counts scored program runs (GEPA's budget unit); calls that only ask for a named
    predictor's feedback on a run already scored (GEPA's ``pred_name=...`` calls while it builds its
    reflective dataset) are counted apart in ``feedback_calls``.

    ``scores_only=True`` returns plain floats (for optimizers such as MIPROv2/BootstrapFewShot that
    test a metric result's truth value); otherwise the metric's own result (score + feedback)."""

    def __init__(self, metric: Callable, scores_only: bool = False, meter: UsageMeter | None = None):
        self.metric = metric
        self.scores_only = scores_only
        self.meter = meter
        self._gepa = _takes_gepa_args(metric)
        self._lock = threading.Lock()
        self.calls = 0
        self.feedback_calls = 0
        self.times: list[float] = []  # perf_counter() of every scored call, for time-to-quality
        self.task_spend: list[tuple[int, int]] = []  # task-LM calls and tokens so far, at every scored call

    def __call__(self, gold, pred, trace=None, pred_name=None, pred_trace=None):
        task = self.meter.snapshot().get("task", {}) if self.meter is not None and pred_name is None else None
        with self._lock:
            if pred_name is None:
                self.calls += 1
                self.times.append(time.perf_counter())
                if task is not None:
                    tokens = task.get("prompt_tokens", 0) + task.get("completion_tokens", 0)
                    self.task_spend.append((task.get("calls", 0), tokens))
            else:
                self.feedback_calls += 1
        if self._gepa:
            out = self.metric(gold, pred, trace, pred_name, pred_trace)
        else:
            out = self.metric(gold, pred, trace)
        return score_of(out) if self.scores_only else out


# ---------------------------------------------------------------------------------------------
# results
# ---------------------------------------------------------------------------------------------
@dataclass
class OptimizerRun:
    """What one optimizer produced under the harness. ``program`` is not serialised.

    ``metric_calls``, ``usage`` and ``wall_time_s`` are totals over every segment of the run (a run
    killed and started again on its ``log_dir`` resumes there); ``segments`` has one entry per segment.
    """

    name: str
    val_score: float | None
    metric_calls: int
    budget: int | None
    usage: dict[str, dict[str, int]]
    wall_time_s: float
    instructions: dict[str, str]
    curve: list[list[float]] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    segments: list[dict] = field(default_factory=list)
    program: Any = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "val_score": self.val_score,
            "metric_calls": self.metric_calls,
            "budget": self.budget,
            "within_budget": None if self.budget is None else self.metric_calls <= self.budget,
            "usage": self.usage,
            "wall_time_s": round(self.wall_time_s, 3),
            "instructions": self.instructions,
            "curve": [[int(c), float(s)] for c, s in self.curve],
            "details": _jsonable(self.details),
            "segments": _jsonable(self.segments),
        }


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    return str(obj)


def instructions_of(program: dspy.Module) -> dict[str, str]:
    return {name: pred.signature.instructions for name, pred in program.named_predictors()}


def demos_of(program: dspy.Module) -> dict[str, int]:
    return {name: len(getattr(pred, "demos", []) or []) for name, pred in program.named_predictors()}


def running_best(points: list[tuple[float, float]]) -> list[list[float]]:
    """Sort (calls, score) points by calls and keep the best score so far."""
    out, best = [], -math.inf
    for calls, score in sorted(points, key=lambda p: p[0]):
        best = max(best, score)
        out.append([int(calls), float(best)])
    return out


# ---------------------------------------------------------------------------------------------
# evaluation
# ---------------------------------------------------------------------------------------------
def evaluate_program(
    program: dspy.Module, examples: list, metric: Callable, *, task_lm: dspy.BaseLM, num_threads: int = 1
) -> tuple[float, int, list[float]]:
    """Average metric score (0..1) of ``program`` on ``examples``; (score, metric calls, per-example scores).
    A program error scores 0 for that example."""
    if not examples:
        return 0.0, 0, []
    counter = CountingMetric(metric, scores_only=True)
    evaluator = dspy.Evaluate(
        devset=examples,
        metric=counter,
        num_threads=max(1, num_threads),
        display_progress=False,
        max_errors=len(examples) + 1,
        failure_score=0.0,
    )
    with dspy.context(lm=task_lm):
        result = evaluator(program)
    scores = [score_of(s) for _ex, _pred, s in result.results]
    return sum(scores) / len(examples), counter.calls, scores


# ---------------------------------------------------------------------------------------------
# MIPROv2 budget plan
# ---------------------------------------------------------------------------------------------
@dataclass
class MiproPlan:
    num_candidates: int
    num_trials: int
    minibatch: bool
    minibatch_size: int
    minibatch_full_eval_steps: int
    max_bootstrapped_demos: int
    max_labeled_demos: int
    expected_calls: int

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _mipro_trial_calls(trials: int, minibatch: bool, size: int, full_every: int, n_val: int) -> int:
    if not minibatch:
        return trials * n_val
    full_evals = trials // full_every + (1 if trials % full_every else 0)
    return trials * size + full_evals * n_val


def mipro_plan(
    budget: int,
    n_train: int,
    n_val: int,
    *,
    max_bootstrapped_demos: int = 4,
    max_labeled_demos: int = 4,
    num_candidates: int | None = None,
    minibatch_size: int = 35,
    full_eval_steps: int = 5,
) -> MiproPlan:
    """Choose MIPROv2 settings whose expected metric calls fit ``budget``.

    Expected calls = bootstrapping ((candidates + 1) bootstrap passes, each assumed to stop after
    about twice the demos it needs, at most the whole trainset) + the default program's full
    validation + the trials: minibatches of ``minibatch_size`` with a full validation every
    ``full_eval_steps`` trials and one at the end (or, when the valset is no larger than a minibatch,
    one full validation per trial). Candidates default to 6 (MIPROv2's "light") and shrink when the
    budget is small; the trials take what is left."""
    boot_demos = max_bootstrapped_demos if max_bootstrapped_demos > 0 else 3  # MIPROv2 bootstraps 3 for the proposer
    minibatch = n_val > minibatch_size
    size = minibatch_size if minibatch else n_val
    candidates = [num_candidates] if num_candidates else [6, 5, 4, 3, 2]
    for cands in candidates:
        boot = (cands + 1) * min(n_train, 2 * boot_demos)
        left = budget - boot - n_val
        trials = 0
        while _mipro_trial_calls(trials + 1, minibatch, size, full_eval_steps, n_val) <= left:
            trials += 1
        if trials >= 1:
            return MiproPlan(
                cands,
                trials,
                minibatch,
                size,
                full_eval_steps,
                max_bootstrapped_demos,
                max_labeled_demos,
                boot + n_val + _mipro_trial_calls(trials, minibatch, size, full_eval_steps, n_val),
            )
    # Too small for even one trial: the smallest run (it will overshoot, and is reported as such).
    cands = candidates[-1]
    boot = (cands + 1) * min(n_train, 2 * boot_demos)
    return MiproPlan(
        cands,
        1,
        minibatch,
        size,
        full_eval_steps,
        max_bootstrapped_demos,
        max_labeled_demos,
        boot + n_val + _mipro_trial_calls(1, minibatch, size, full_eval_steps, n_val),
    )


# ---------------------------------------------------------------------------------------------
# the optimizers
# ---------------------------------------------------------------------------------------------
def _run_baseline(program, trainset, valset, metric, ctx) -> tuple[Any, float, list, dict]:
    score, _calls, _ = evaluate_program(program, valset, metric, task_lm=ctx["task_lm"], num_threads=ctx["num_threads"])
    return program.deepcopy(), score, [(len(valset), score)], {}


def _run_agentgrad(program, trainset, valset, metric, ctx):
    from dspy_agentgrad import AgentGrad
    from dspy_agentgrad.config import AgentGradConfig

    budget = ctx["max_metric_calls"]
    switches = {**ctx["options"].get("agentgrad", {}), **ABLATION.get(ctx["name"], {})}
    stop_callbacks = switches.pop("stop_callbacks", None)  # AgentGrad's own argument, not a config option
    opt = AgentGrad(
        metric,
        prompt_model=ctx["prompt_lm"],
        task_model=ctx["task_lm"],
        auto=None if budget else "light",
        max_metric_calls=budget,
        hint_fn=ctx["hint_fn"],
        num_threads=ctx["num_threads"],
        seed=ctx["seed"],
        log_dir=ctx["log_dir"],
        stop_callbacks=stop_callbacks,
        config=AgentGradConfig.from_options(
            track_stats=True,
            **{"max_task_tokens": ctx["max_task_tokens"]} if ctx["max_task_tokens"] else {},
            **switches,
        ),
    )
    with dspy.context(lm=ctx["task_lm"]):
        compiled = opt.compile(program, trainset=trainset, valset=valset)
    res = compiled.detailed_results
    details = {
        "reported_metric_calls": res.metric_calls,
        "reported_usage": res.usage,
        "reported_wall_time_s": res.wall_time_s,
        "result": res.to_dict(),
    }
    curve = [(c, s) for c, s in res.val_history]
    return compiled, float(res.best_val_score), curve, details


def _run_gepa(program, trainset, valset, metric, ctx):
    budget = ctx["max_metric_calls"]
    kwargs = dict(ctx["options"].get("gepa", {}))
    if budget:
        kwargs["max_metric_calls"] = budget
    else:
        kwargs.setdefault("auto", "light")
    if ctx["max_task_tokens"]:
        gepa_kwargs = dict(kwargs.get("gepa_kwargs") or {})
        stops = gepa_kwargs.get("stop_callbacks") or []
        stops = list(stops) if isinstance(stops, (list, tuple)) else [stops]
        gepa_kwargs["stop_callbacks"] = [*stops, TaskTokenStop(ctx["meter"], ctx["max_task_tokens"])]
        kwargs["gepa_kwargs"] = gepa_kwargs
    opt = dspy.GEPA(
        metric=metric,
        reflection_lm=ctx["prompt_lm"],
        num_threads=ctx["num_threads"],
        track_stats=True,
        seed=ctx["seed"],
        log_dir=ctx["log_dir"],
        **kwargs,
    )
    with dspy.context(lm=ctx["task_lm"]):
        compiled = opt.compile(program, trainset=trainset, valset=valset)
    res = compiled.detailed_results
    scores = list(res.val_aggregate_scores)
    # GEPA records a candidate's count before paying for its validation pass; the point is reached (the
    # score is known) only after it, as AgentGrad's points are: shift by one full validation pass.
    curve = [(calls + len(valset), score) for calls, score in zip(res.discovery_eval_counts, scores)]
    details = {
        "num_candidates": len(scores),
        "best_idx": res.best_idx,
        "reported_metric_calls": res.total_metric_calls,
        "num_full_val_evals": res.num_full_val_evals,
        "candidate_val_scores": scores,
        "discovery_eval_counts": list(res.discovery_eval_counts),
    }
    return compiled, float(scores[res.best_idx]), curve, details


@dataclass
class TaskTokenStop:
    """A GEPA stopper (``gepa_kwargs["stop_callbacks"]``): stop once the task LM has used ``max_tokens``.
    GEPA asks it between iterations, so a run can end up to one iteration past the cap."""

    meter: UsageMeter
    max_tokens: int

    def __call__(self, gepa_state: Any) -> bool:
        task = self.meter.snapshot().get("task", {})
        return task.get("prompt_tokens", 0) + task.get("completion_tokens", 0) >= self.max_tokens


def _run_miprov2(program, trainset, valset, metric, ctx):
    if ctx["max_task_tokens"]:
        logger.warning("MIPROv2 has no stop hook: the task-LM token budget is not applied to it (spend is reported)")
    budget = ctx["max_metric_calls"]
    options = dict(ctx["options"].get("miprov2", {}))
    demos = options.pop("max_bootstrapped_demos", 4), options.pop("max_labeled_demos", 4)
    init_kwargs: dict[str, Any] = {}
    compile_kwargs: dict[str, Any] = {}
    plan = None
    if budget:
        plan = mipro_plan(
            budget,
            len(trainset),
            len(valset),
            max_bootstrapped_demos=demos[0],
            max_labeled_demos=demos[1],
            num_candidates=options.pop("num_candidates", None),
        )
        init_kwargs.update(auto=None, num_candidates=plan.num_candidates)
        compile_kwargs.update(
            num_trials=plan.num_trials,
            minibatch_size=plan.minibatch_size,
            minibatch_full_eval_steps=plan.minibatch_full_eval_steps,
            minibatch=plan.minibatch,
        )
    else:
        init_kwargs["auto"] = "light"
    counter_before = ctx["counter"].calls
    opt = dspy.MIPROv2(
        metric=metric,
        prompt_model=ctx["prompt_lm"],
        task_model=ctx["task_lm"],
        max_bootstrapped_demos=demos[0],
        max_labeled_demos=demos[1],
        num_threads=ctx["num_threads"],
        seed=ctx["seed"] + 9,
        verbose=False,
        log_dir=ctx["log_dir"],
        **init_kwargs,
        **options,
    )
    with dspy.context(lm=ctx["task_lm"]):
        compiled = opt.compile(program, trainset=trainset, valset=valset, **compile_kwargs)
    logs = getattr(compiled, "trial_logs", {}) or {}
    full = [
        (log["total_eval_calls_so_far"], score_of(log["full_eval_score"]) / 100.0)
        for _t, log in sorted(logs.items())
        if "full_eval_score" in log and "total_eval_calls_so_far" in log
    ]
    spent = ctx["counter"].calls - counter_before
    # MIPROv2's own call count leaves out bootstrapping: shift its points by the difference.
    offset = max(0, spent - max((c for c, _ in full), default=0))
    curve = [(c + offset, s) for c, s in full]
    val = (
        score_of(getattr(compiled, "score", None)) / 100.0
        if getattr(compiled, "score", None) is not None
        else (max((s for _, s in full), default=0.0))
    )
    details = {
        "plan": plan.as_dict() if plan else None,
        "demos": demos_of(compiled),
        "num_trials_logged": len(logs),
        "curve_offset_bootstrap_calls": offset,
    }
    return compiled, val, curve, details


def _run_textgrad(program, trainset, valset, metric, ctx):
    from benchmarks.tgd import TextGradSettings, optimize

    def evaluate(candidate):
        score, _calls, _ = evaluate_program(
            candidate, valset, metric, task_lm=ctx["task_lm"], num_threads=ctx["num_threads"]
        )
        return score

    outcome = optimize(
        program,
        trainset,
        valset,
        metric,
        evaluate=evaluate,
        task_lm=ctx["task_lm"],
        prompt_lm=ctx["prompt_lm"],
        budget=ctx["max_metric_calls"],
        spent=lambda: ctx["counter"].calls,
        seed=ctx["seed"],
        settings=TextGradSettings(**ctx["options"].get("textgrad", {})),
    )
    return outcome.program, outcome.val_score, outcome.curve, outcome.details


_RUNNERS = {
    "baseline": _run_baseline,
    "agentgrad": _run_agentgrad,
    "gepa": _run_gepa,
    "miprov2": _run_miprov2,
    "textgrad": _run_textgrad,
    **dict.fromkeys(ABLATION, _run_agentgrad),
}


def run_optimizer(
    name: str,
    program: dspy.Module,
    trainset: list,
    valset: list,
    metric: Callable,
    *,
    task_lm: dspy.BaseLM,
    prompt_lm: dspy.BaseLM,
    max_metric_calls: int | None,
    max_task_tokens: int | None = None,
    seed: int = 0,
    num_threads: int = 1,
    hint_fn: Callable | None = None,
    log_dir: str | Path | None = None,
    cache_dir: str | Path | None = None,
    options: dict[str, dict] | None = None,
    extra_lms: dict[str, dspy.BaseLM] | None = None,
) -> OptimizerRun:
    """Run optimizer ``name`` (one of :data:`OPTIMIZERS`) on ``program``; the ``agentgrad-*`` names are
    AgentGrad with the :data:`ABLATION` switches.

    ``metric`` is GEPA's feedback metric ``(gold, pred, trace, pred_name, pred_trace)``; MIPROv2 and
    the baseline get its score only. ``cache_dir``: a DSPy disk cache used only by this run (``None``
    leaves DSPy's cache configuration alone; ``"off"`` disables the cache). ``options``: extra
    keyword arguments per optimizer, e.g. ``{"gepa": {"use_merge": False}}``. ``max_task_tokens``: a task-LM
    token budget too (AgentGrad: its hard cap; GEPA: a stop checked between iterations; MIPROv2: none).
    ``extra_lms``: the benchmark's other LMs by role (PUPA's ``untrusted`` and ``judge``), metered under their role.
    """
    if name not in _RUNNERS:
        raise ValueError(f"unknown optimizer {name!r}; choose from {', '.join(OPTIMIZERS)}")
    if name == "textgrad":
        import benchmarks.tgd  # noqa: F401 -- its import (litellm's, seconds) is not the optimizer's time
    if prompt_lm is task_lm:
        prompt_lm = task_lm.copy()  # two instances, so calls can be told apart by role
    meter = UsageMeter()
    meter.attach(task_lm, "task")
    meter.attach(prompt_lm, "prompt")
    for role, lm in (extra_lms or {}).items():
        meter.attach(lm, role)
    if cache_dir is not None:
        configure_cache(cache_dir)
    if log_dir is not None:
        Path(log_dir).mkdir(parents=True, exist_ok=True)
    counter = CountingMetric(metric, scores_only=(name in ("miprov2", "baseline")), meter=meter)
    ctx = {
        "task_lm": task_lm,
        "prompt_lm": prompt_lm,
        "max_metric_calls": max_metric_calls,
        "max_task_tokens": max_task_tokens,
        "meter": meter,
        "seed": seed,
        "num_threads": max(1, int(num_threads or 1)),
        "hint_fn": hint_fn,
        "log_dir": None if log_dir is None else str(log_dir),
        "options": options or {},
        "counter": counter,
        "name": name,
    }
    logger.info("running %s (budget %s metric calls)", name, max_metric_calls)
    start = time.perf_counter()
    with SegmentLog(log_dir, meter, counter) as segments:  # a resumed run counts its earlier segments too
        if name == "baseline":
            compiled, val, curve, details = _run_baseline(program, trainset, valset, metric, ctx)
            calls = len(valset)
        else:
            compiled, val, curve, details = _RUNNERS[name](program, trainset, valset, counter, ctx)
            calls = counter.calls
            details["feedback_only_metric_calls"] = counter.feedback_calls
        segments.finish(calls)
    totals = segments.totals()
    curve = running_best(curve)
    if curve and curve[-1][0] < calls:
        curve.append([calls, curve[-1][1]])  # the budget spent after the last improvement
    if name != "baseline" and counter.times:  # seconds since start at which each curve point's call was made
        at = [min(max(int(c), 1), len(counter.times)) - 1 for c, _ in curve]
        details["curve_seconds"] = [round(counter.times[i] - start, 3) for i in at]
        # task-LM calls and tokens spent when each curve point's call was made (this segment's; equal
        # budgets in metric calls are not equal spend when one optimizer reuses runs)
        details["curve_task_calls"] = [counter.task_spend[i][0] for i in at]
        details["curve_task_tokens"] = [counter.task_spend[i][1] for i in at]
    return OptimizerRun(
        name=name,
        val_score=val,
        metric_calls=totals["metric_calls"],
        budget=max_metric_calls,
        usage=totals["usage"],
        wall_time_s=totals["wall_time_s"],
        instructions=instructions_of(compiled),
        curve=curve,
        details=details,
        segments=segments.segments,
        program=compiled,
    )


def configure_cache(cache_dir: str | Path) -> None:
    """Point DSPy's cache at ``cache_dir`` (fresh memory cache too), or turn it off with ``"off"``."""
    if str(cache_dir) == "off":
        dspy.configure_cache(enable_disk_cache=False, enable_memory_cache=False)
        return
    Path(cache_dir).mkdir(parents=True, exist_ok=True)
    dspy.configure_cache(enable_disk_cache=True, enable_memory_cache=True, disk_cache_dir=str(cache_dir))
