"""Options of an AgentGrad run, their checks, and the ``auto`` budget presets."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from .identity import check_resume_despite
from .program.executor import check_executor
from .program.hint_delivery import HINT_DELIVERIES
from .program.hints import PLACEBOS
from .program.objectives import check_guards

#: Candidates per preset, as dspy.GEPA's ``AUTO_RUN_SETTINGS``: equal ``auto`` means equal budgets.
AUTO_CANDIDATES = {"light": 6, "medium": 12, "heavy": 18}
DEFAULT_TRAIN_BATCH = 16
CLUSTERINGS = ("lm", "tfidf", "embedding")
#: Options a preset sets (an option passed explicitly wins). "paper": the paper's procedure, every run
#: scored, one hint level and one candidate at a time, each candidate validated on its own, no cumulative
#: hints, no reflections on hard cases, a large-medium-small cyclic minimum cluster size.
PRESETS = {
    "paper": {
        "reuse_calls": False,
        "speculate": False,
        "validate_together": False,
        "stack_rounds": 1,
        "cumulative_hints": False,
        "cluster_schedule": (3, 2, 1),
        "reflect_hard_cases": False,
    },
}
VAL_ACCEPTANCE = ("strict", "non_decreasing", "robust")
CANDIDATE_KINDS = ("instructions", "demos", "both")


def auto_budget(auto: str, n_predictors: int, n_val: int) -> int:
    """Metric calls an ``auto`` preset means: the budget ``dspy.GEPA(auto=...)`` gives the same program and data.

    dspy's rule (``GEPA.auto_budget``, minibatch 35, a full evaluation every 5 trials), with
    n = 6 / 12 / 18 candidates and N predictors: ``T = max(4 N log2(n), 1.5 n)`` trials (rounded
    down) and ``n_val + 5 n + 35 T + ((T + 1) // 5 + 1 + [T < 5]) n_val`` calls.
    Example: 4 predictors, 50 validation examples, "light": T = 41, 50 + 30 + 1435 + 9 * 50 = 1965.
    """
    if auto not in AUTO_CANDIDATES:
        raise ValueError(f"auto must be one of {sorted(AUTO_CANDIDATES)} or None; got {auto!r}")
    candidates = AUTO_CANDIDATES[auto]
    trials = int(max(2 * (max(n_predictors, 1) * 2) * math.log2(candidates), 1.5 * candidates))
    full_evals = (trials + 1) // 5 + 1 + (1 if trials < 5 else 0)
    return n_val + candidates * 5 + trials * 35 + full_evals * n_val


def worst_case_calls(
    rounds: int, n_predictors: int, n_train: int, n_val: int, train_batch_size: int, schedule_length: int = 1
) -> int:
    """The most metric calls ``rounds`` rounds can take, after one initial validation pass. Per round: the
    batch; one hinted run per failure and predictor; 2(N - 1) cumulative and pruning runs per failure and, with
    two predictors or more, a placebo run per placebo wording and predictor but one; and per gradient (at most one per
    failure and predictor, kept waiting for up to ``schedule_length`` rounds) a candidate whose checks run its
    cluster before and after and one validation pass."""
    b = min(train_batch_size, n_train)
    n = n_predictors
    gradients = schedule_length * b * n
    return n_val + rounds * (b * (1 + n + (2 + len(PLACEBOS)) * max(n - 1, 0)) + gradients * (2 + n_val))


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_int(name: str, value: object, minimum: int | None, optional: bool = False) -> None:
    """An integer option (``None`` allowed when ``optional``), at least ``minimum``."""
    if value is None and optional:
        return
    if not _is_int(value) or (minimum is not None and value < minimum):
        bound = "an integer" if minimum is None else f"an integer >= {minimum}"
        raise ValueError(f"{name} must be {bound}{' or None' if optional else ''}; got {value!r}")


def check_number(
    name: str, value: object, low: float, high: float, low_open: bool = False, optional: bool = False
) -> None:
    """A real option in ``[low, high]`` (``(low, high]`` when ``low_open``); never NaN, a bool or a string."""
    if value is None and optional:
        return
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or not (low < value if low_open else low <= value) or value > high:
        span = f"{'(' if low_open else '['}{low:g}, {high:g}]".replace("inf]", "inf)").replace("[-inf", "(-inf")
        raise ValueError(f"{name} must be a finite number in {span}{' or None' if optional else ''}; got {value!r}")


def check_scores(max_score: object, failure_score: object, fix_threshold: object) -> None:
    """Any finite ``max_score`` (the metric's best score); ``failure_score`` (what a failed run scores) below it,
    so that a failure never counts as a success; ``fix_threshold`` in ``(failure_score, max_score]``."""
    check_number("max_score", max_score, -math.inf, math.inf)
    check_number("failure_score", failure_score, -math.inf, max_score)
    if failure_score >= max_score:
        raise ValueError(
            f"failure_score={failure_score!r} must be below max_score={max_score!r}: a run that fails (an LM error, "
            "a metric that raises) would count as a success; pass failure_score=<the metric's worst score>"
            + (" (needed when max_score is 0 or below, e.g. failure_score=-100)" if max_score <= 0 else "")
        )
    check_number("fix_threshold", fix_threshold, failure_score, max_score, low_open=True, optional=True)


@dataclass
class AgentGradConfig:
    """Every option of a run, with its default: defined once here, taken by ``AgentGrad(...)`` as keywords.

    The README's option table explains each; :meth:`validate` says what is wrong with a bad value.
    """

    auto: str | None = "light"
    max_metric_calls: int | None = None
    max_full_evals: int | None = None  # GEPA's budget unit: passes over train + validation
    max_rounds: int | None = None
    max_prompt_tokens: int | None = None
    max_prompt_cost: float | None = None
    max_task_calls: int | None = None
    max_task_tokens: int | None = None
    num_threads: int = 1
    seed: int = 0
    max_score: float = 1.0
    fix_threshold: float | None = None
    train_batch_size: int = DEFAULT_TRAIN_BATCH
    cluster_schedule: tuple[int, ...] = (2, 1)
    clustering: str = "lm"
    target_identification: bool = True
    agent_supervision: bool = True
    semantic_abstraction: bool = True
    leak_check: bool = True
    label_fields: tuple[str, ...] | None = None
    cumulative_hints: bool = True
    reflect_hard_cases: bool = True
    failure_score: float = 0.0
    hint_delivery: str = "input_field"
    retry_attempts: int = 3
    retry_backoff_s: float = 1.0
    track_stats: bool = True
    resume_despite: tuple[str, ...] = ()
    optimize_predictors: tuple[str, ...] | None = None
    use_mlflow: bool = False
    val_acceptance: str = "strict"
    eval_chunk_size: int = 16
    max_field_chars: int = 12000
    max_instruction_chars: int = 4000
    reuse_calls: bool = True
    speculate: bool = True
    validate_together: bool = True
    stack_rounds: int = 2
    preset: str | None = None
    candidates: str = "instructions"
    max_demos: int = 3
    run_timeout_s: float | None = None  # a program run past it is abandoned (a ``timeout`` error), tried once more
    metric_timeout_s: float | None = None  # the same for a metric call
    objective_guards: dict[str, float] | None = None  # objective -> how far its validation mean may fall
    executor: Any = "local"  # where program runs and metric calls run: "local" threads, "ray", or an executor

    @classmethod
    def from_options(cls, **options: Any) -> AgentGradConfig:
        """The config for ``AgentGrad(...)``'s keyword options, not yet validated.

        An unknown name raises the TypeError a call with a wrong keyword raises; sequences become
        tuples (they are part of the run's fingerprint); ``num_threads=None`` means the default;
        ``max_metric_calls`` or ``max_full_evals`` without ``auto`` turns the default ``auto`` off.
        """
        preset = options.get("preset")
        if preset is not None and preset not in PRESETS:
            raise ValueError(f"preset must be one of {sorted(PRESETS)} or None; got {preset!r}")
        options = {**PRESETS.get(preset or "", {}), **options}  # an option passed explicitly wins
        if "auto" not in options and any(options.get(n) is not None for n in ("max_metric_calls", "max_full_evals")):
            options["auto"] = None  # a budget in calls replaces the default preset, as in dspy.GEPA(max_metric_calls=N)
        known = {f.name for f in fields(cls)}
        for name in options:
            if name not in known:
                raise TypeError(f"AgentGrad() got an unexpected keyword argument {name!r}")
        if "num_threads" in options and options["num_threads"] is None:
            del options["num_threads"]
        if "cluster_schedule" in options:
            options["cluster_schedule"] = tuple(options["cluster_schedule"])
        for name in ("label_fields", "optimize_predictors"):
            if options.get(name) is not None:
                options[name] = tuple(options[name])
        return cls(**options)

    def validate(self) -> None:
        """Raise a ValueError that says how to fix the first bad option."""
        if self.auto is not None and self.auto not in AUTO_CANDIDATES:
            raise ValueError(f"auto must be one of {sorted(AUTO_CANDIDATES)} or None; got {self.auto!r}")
        for name in ("max_metric_calls", "max_full_evals"):
            value = getattr(self, name)
            if self.auto is not None and value is not None:
                raise ValueError(
                    f"auto={self.auto!r} and {name}={value} both set the budget; pass auto=None to use {name}"
                )
        if self.max_metric_calls is not None and self.max_full_evals is not None:
            raise ValueError("max_metric_calls and max_full_evals both set the budget; pass one of them")
        if all(v is None for v in (self.auto, self.max_metric_calls, self.max_full_evals, self.max_rounds)):
            raise ValueError(
                "no budget: set auto ('light', 'medium', 'heavy'), max_metric_calls, max_full_evals, or max_rounds"
            )
        optional_counts = ("max_metric_calls", "max_full_evals", "max_rounds", "max_prompt_tokens", "max_task_calls")
        for name in (*optional_counts, "max_task_tokens"):
            check_int(name, getattr(self, name), 1, optional=True)
        for name in (
            "num_threads",
            "train_batch_size",
            "retry_attempts",
            "eval_chunk_size",
            "max_field_chars",
            "stack_rounds",
        ):
            check_int(name, getattr(self, name), 1)
        check_int("max_instruction_chars", self.max_instruction_chars, 50)
        check_int("seed", self.seed, None)
        check_scores(self.max_score, self.failure_score, self.fix_threshold)
        check_number("max_prompt_cost", self.max_prompt_cost, 0, math.inf, low_open=True, optional=True)
        check_number("retry_backoff_s", self.retry_backoff_s, 0, math.inf)
        if not self.cluster_schedule or any(not _is_int(m) or m < 1 for m in self.cluster_schedule):
            raise ValueError(
                f"cluster_schedule must be a non-empty sequence of positive integers; got {self.cluster_schedule!r}"
            )
        if self.clustering not in CLUSTERINGS:
            raise ValueError(f"clustering must be one of {CLUSTERINGS}; got {self.clustering!r}")
        if self.optimize_predictors is not None and (
            not self.optimize_predictors or not all(isinstance(n, str) for n in self.optimize_predictors)
        ):
            raise ValueError(
                "optimize_predictors must be a non-empty list of predictor names or None; "
                f"got {self.optimize_predictors!r}"
            )
        if self.hint_delivery not in HINT_DELIVERIES:
            raise ValueError(f"hint_delivery must be one of {HINT_DELIVERIES}; got {self.hint_delivery!r}")
        self.resume_despite = check_resume_despite(self.resume_despite)
        if self.label_fields is not None and not all(isinstance(f, str) for f in self.label_fields):
            raise ValueError(f"label_fields must be a sequence of field names or None; got {self.label_fields!r}")
        if self.val_acceptance not in VAL_ACCEPTANCE:
            raise ValueError(f"val_acceptance must be one of {VAL_ACCEPTANCE}; got {self.val_acceptance!r}")
        if self.candidates not in CANDIDATE_KINDS:
            raise ValueError(
                f"candidates must be one of {CANDIDATE_KINDS} (instruction rewrites as in the paper, demonstrations "
                f"from pseudo-labels, or both); got {self.candidates!r}"
            )
        check_int("max_demos", self.max_demos, 1)
        for name in ("run_timeout_s", "metric_timeout_s"):
            check_number(name, getattr(self, name), 0, math.inf, low_open=True, optional=True)
        self.objective_guards = check_guards(self.objective_guards)
        check_executor(self.executor)

    def fingerprint(self) -> dict:
        """The options that change decisions (not threads, logging or stats)."""
        data = asdict(replace(self, executor="local"))  # an executor object is no value to copy
        for key in ("num_threads", "track_stats", "retry_backoff_s", "resume_despite", "use_mlflow", "executor"):
            data.pop(key)
        for key in ("run_timeout_s", "metric_timeout_s", "objective_guards"):  # as before they existed, when unset
            if data[key] is None:
                data.pop(key)
        if self.candidates == "instructions":  # as before demonstrations existed: older runs still resume
            data.pop("candidates")
            data.pop("max_demos")
        if not self.reflect_hard_cases:  # as before reflections existed: older runs still resume
            data.pop("reflect_hard_cases")
        data["cluster_schedule"] = list(self.cluster_schedule)
        if self.optimize_predictors is not None:
            data["optimize_predictors"] = list(self.optimize_predictors)
        data["label_fields"] = None if self.label_fields is None else list(self.label_fields)
        return data

    def frozen(self, names: list[str]) -> set[str]:
        """The predictors among ``names`` whose instructions stay as they are."""
        return set() if self.optimize_predictors is None else set(names) - set(self.optimize_predictors)
