"""The groups of a run's options, each a frozen dataclass that checks its own fields when it is built."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from .option_checks import check_int, check_number, check_scores, is_int
from .program.executor import check_executor
from .program.hint_delivery import HINT_DELIVERIES
from .program.objectives import check_guards
from .runtime.budget import Budget
from .runtime.fingerprint import OVERRIDABLE

#: Candidates per preset, as dspy.GEPA's ``AUTO_RUN_SETTINGS``: equal ``auto`` means equal budgets.
AUTO_CANDIDATES = {"light": 6, "medium": 12, "heavy": 18}
DEFAULT_TRAIN_BATCH = 16
CLUSTERINGS = ("lm", "tfidf", "embedding")
VAL_ACCEPTANCE = ("strict", "non_decreasing", "robust")
CANDIDATE_KINDS = ("instructions", "demos", "both")
CUMULATIVE_HINTS = (True, False, "revisits")


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


def check_resume_despite(parts: Any) -> tuple[str, ...]:
    """``resume_despite`` as a tuple of known parts: a typo must not silently skip a check."""
    parts = (parts,) if isinstance(parts, str) else tuple(parts or ())
    unknown = [p for p in parts if p not in OVERRIDABLE]
    if unknown:
        raise ValueError(f"resume_despite accepts {', '.join(OVERRIDABLE)}; got {', '.join(map(repr, unknown))}")
    return parts


@dataclass(frozen=True)
class BudgetOptions:
    """When the run stops: the first cap reached ends it.

    auto: "light", "medium" or "heavy": the metric-call budget dspy.GEPA(auto=...) gives the same program and data
        (:func:`auto_budget`); None to use only the caps below.
    max_metric_calls: cap on program runs scored by the metric (GEPA's unit); never exceeded.
    cap_task_spend: ``max_metric_calls`` also caps the runs' task spend: each run, scored or not, counts the share
        of its calls it made anew (:attr:`.Outcome.task_share`), so the task-LM calls stay within about one per
        predictor and metric call, as ``dspy.GEPA``'s do, and a round whose runs all took earlier scores is paid
        for, so it no longer counts as stalled. Off by default: on the zoo it bounds spend but lowers the worst
        worlds' test scores (docs/zoo.md).
    overdraft_rounds: once the runs' task spend has passed ``max_metric_calls`` (a ``dspy.GEPA`` run's worth of
        program runs), the run stops after this many rounds in a row without a validation gain (a stack still
        waiting for its pass gets it first); None: it spends to its budget. Runs whose scores are reused cost no
        metric call, so without it a run that stopped gaining can spend several times GEPA's task tokens
        (docs/zoo.md).
    max_full_evals: the cap in GEPA's other unit: that many passes over train + validation.
    max_rounds: cap on rounds.
    max_prompt_tokens, max_prompt_cost: caps on the prompt LM: tokens, or USD priced with litellm's price table.
    max_task_calls, max_task_tokens: caps on the task LM (the program's predictor calls), whatever reuse saves.
    """

    auto: str | None = "light"
    max_metric_calls: int | None = None
    cap_task_spend: bool = False
    overdraft_rounds: int | None = 1
    max_full_evals: int | None = None
    max_rounds: int | None = None
    max_prompt_tokens: int | None = None
    max_prompt_cost: float | None = None
    max_task_calls: int | None = None
    max_task_tokens: int | None = None

    def __post_init__(self) -> None:
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
        counts = ("max_metric_calls", "max_full_evals", "max_rounds", "max_prompt_tokens", "max_task_calls")
        for name in (*counts, "max_task_tokens", "overdraft_rounds"):
            check_int(name, getattr(self, name), 1, optional=True)
        check_number("max_prompt_cost", self.max_prompt_cost, 0, math.inf, low_open=True, optional=True)

    def check_bounded(self) -> None:
        """A run needs some cap: checked on the config a run starts with, not on each config built on the way."""
        if all(v is None for v in (self.auto, self.max_metric_calls, self.max_full_evals, self.max_rounds)):
            raise ValueError(
                "no budget: set auto ('light', 'medium', 'heavy'), max_metric_calls, max_full_evals, or max_rounds"
            )

    def caps(self, max_calls: int | None) -> Budget:
        """The run's caps: ``max_calls`` metric calls, prompt-LM tokens and cost, task-LM calls and tokens."""
        caps = (self.max_prompt_tokens, self.max_prompt_cost, self.max_task_calls, self.max_task_tokens)
        return Budget(max_calls, *caps, cap_task_spend=self.cap_task_spend)

    def metric_calls(self, n_predictors: int, n_train: int, n_val: int) -> int | None:
        """The cap on metric calls for this program and data: ``auto``'s budget, ``max_full_evals`` passes over
        train + validation (as dspy.GEPA counts a full evaluation), or ``max_metric_calls``."""
        calls = self.max_metric_calls
        if self.auto is not None:
            calls = auto_budget(self.auto, n_predictors, n_val)
        if self.max_full_evals is not None:
            calls = self.max_full_evals * (n_train + n_val)
        return calls


@dataclass(frozen=True)
class ScoreOptions:
    """What the metric's scores mean.

    max_score: the score that counts as solved (``perfect_score`` is GEPA's name for it).
    failure_score: the score of a run whose metric raised or whose program failed; below ``max_score``.
    fix_threshold: the score a hinted run must reach (and improve on) for its failure to be attributed; None:
        ``max_score``, the paper's rule. A lower value lets partial fixes count.
    """

    max_score: float = 1.0
    failure_score: float = 0.0
    fix_threshold: float | None = None

    def __post_init__(self) -> None:
        check_scores(self.max_score, self.failure_score, self.fix_threshold)


@dataclass(frozen=True)
class AttributionOptions:
    """Step 1, finding the predictor at fault for each failure of a round's batch.

    train_batch_size: training examples per round (epoch-shuffled).
    target_identification: the paper's ablation switch: off, no intervention; each round blames one predictor,
        round-robin, for every failure.
    leak_check: a hinted fix that copies a revealed label its inputs do not contain counts only as a fallback.
    label_fields: the example fields the default hint reveals; None: the labels the program outputs.
    cumulative_hints: failures no single hint fixes get cumulative hints: "revisits", only when their example
        comes back in a later batch or in the last round ``max_rounds`` allows (the first time, the round's
        single-hint fixes may be what resolves them); True, every time; False, never.
    hint_delivery: how a hint reaches the hinted predictor: "input_field", "instruction" or "demo".
    """

    train_batch_size: int = DEFAULT_TRAIN_BATCH
    target_identification: bool = True
    leak_check: bool = True
    label_fields: tuple[str, ...] | None = None
    cumulative_hints: bool | str = "revisits"
    hint_delivery: str = "input_field"

    def __post_init__(self) -> None:
        check_int("train_batch_size", self.train_batch_size, 1)
        if self.label_fields is not None:
            object.__setattr__(self, "label_fields", tuple(self.label_fields))
            if not all(isinstance(f, str) for f in self.label_fields):
                raise ValueError(f"label_fields must be a sequence of field names or None; got {self.label_fields!r}")
        if self.cumulative_hints not in CUMULATIVE_HINTS:
            raise ValueError(f"cumulative_hints must be True, False or 'revisits'; got {self.cumulative_hints!r}")
        if self.hint_delivery not in HINT_DELIVERIES:
            raise ValueError(f"hint_delivery must be one of {HINT_DELIVERIES}; got {self.hint_delivery!r}")


@dataclass(frozen=True)
class AbstractionOptions:
    """Steps 3-4, turning attributed failures into gradients and clusters.

    cluster_schedule: the cyclic minimum cluster size, one entry per round.
    clustering: "lm" (the aggregator LM clusters and abstracts), "tfidf" or "embedding" (scikit-learn groups).
    semantic_abstraction: the paper's ablation switch: off, random minibatches replace the clusters.
    agent_supervision: the paper's ablation switch: off, gradients come from the system-level output, the gold
        labels and the feedback, not from the predictor's pseudo-label.
    embedder: with clustering="embedding": a litellm embedding model name, a dspy.Embedder, or a function
        ``list[str] -> vectors``.
    """

    cluster_schedule: tuple[int, ...] = (2, 1)
    clustering: str = "lm"
    semantic_abstraction: bool = True
    agent_supervision: bool = True
    embedder: Any = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "cluster_schedule", tuple(self.cluster_schedule))
        if not self.cluster_schedule or any(not is_int(m) or m < 1 for m in self.cluster_schedule):
            raise ValueError(
                f"cluster_schedule must be a non-empty sequence of positive integers; got {self.cluster_schedule!r}"
            )
        if self.clustering not in CLUSTERINGS:
            raise ValueError(f"clustering must be one of {CLUSTERINGS}; got {self.clustering!r}")


@dataclass(frozen=True)
class JudgingOptions:
    """Step 5, keeping a candidate that won its cluster only if it does no worse on validation.

    val_acceptance: "non_decreasing" (at least equal to the best), "strict" (higher, the paper's) or "robust"
        (still higher with the validation example it gains most on left out).
    validate_together: a round's winners take one validation pass together; if the stack loses, each alone.
    stack_rounds: with validate_together: rounds grouped in windows of this many share one validation pass.
    objective_guards: objective name -> how far its validation mean may fall for a candidate to be kept.
    prune_rewrites: where a validation pass that kept rewrites left examples worse, each sentence they added is
        left out in turn, and goes if validation does no worse without it (better, with val_acceptance="strict").
    """

    val_acceptance: str = "non_decreasing"
    validate_together: bool = True
    stack_rounds: int = 2
    objective_guards: dict[str, float] | None = None
    prune_rewrites: bool = True

    def __post_init__(self) -> None:
        if self.val_acceptance not in VAL_ACCEPTANCE:
            raise ValueError(f"val_acceptance must be one of {VAL_ACCEPTANCE}; got {self.val_acceptance!r}")
        check_int("stack_rounds", self.stack_rounds, 1)
        object.__setattr__(self, "objective_guards", check_guards(self.objective_guards))


@dataclass(frozen=True)
class ProposalOptions:
    """What a round's attributed failures propose, and which predictors may change.

    candidates: "instructions" (a rewrite per cluster, the paper), "demos" (the pseudo-labels as demonstrations)
        or "both".
    max_demos: most demonstrations added to one predictor (after the program's own).
    max_instruction_chars: longest instruction a rewrite may have.
    reflect_hard_cases: in a round where no failure could be attributed, each predictor reflects on the hard cases.
    optimize_predictors: names of the predictors whose instructions may change; None: all.
    """

    candidates: str = "instructions"
    max_demos: int = 3
    max_instruction_chars: int = 4000
    reflect_hard_cases: bool = True
    optimize_predictors: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.candidates not in CANDIDATE_KINDS:
            raise ValueError(
                f"candidates must be one of {CANDIDATE_KINDS} (instruction rewrites as in the paper, demonstrations "
                f"from pseudo-labels, or both); got {self.candidates!r}"
            )
        check_int("max_demos", self.max_demos, 1)
        check_int("max_instruction_chars", self.max_instruction_chars, 50)
        if self.optimize_predictors is not None:
            object.__setattr__(self, "optimize_predictors", tuple(self.optimize_predictors))
            if not self.optimize_predictors or not all(isinstance(n, str) for n in self.optimize_predictors):
                raise ValueError(
                    "optimize_predictors must be a non-empty list of predictor names or None; "
                    f"got {self.optimize_predictors!r}"
                )

    def frozen(self, names: list[str]) -> set[str]:
        """The predictors among ``names`` whose instructions stay as they are."""
        return set() if self.optimize_predictors is None else set(names) - set(self.optimize_predictors)


@dataclass(frozen=True)
class ExecutionOptions:
    """How program runs and metric calls are carried out; none of these changes a decision but ``seed``.

    num_threads: parallel program runs and LM-role calls; results are identical for any value.
    seed: batch order, the validation split, ablation minibatches.
    reuse_calls: replay a predictor call (and a score) an earlier run of the same example already paid for.
    speculate: run ahead, unscored and in parallel, the program runs the next steps may need.
    retry_attempts: tries for a transient error that no dspy.LM retried (tools, retrievers, the metric).
    run_timeout_s, metric_timeout_s: a program run or metric call past it is abandoned and tried once more.
    executor: where runs and metric calls happen: "local" threads, "ray", or an executor object.
    """

    num_threads: int = 1
    seed: int = 0
    reuse_calls: bool = True
    speculate: bool = False
    retry_attempts: int = 3
    run_timeout_s: float | None = None
    metric_timeout_s: float | None = None
    executor: Any = "local"

    def __post_init__(self) -> None:
        check_int("num_threads", self.num_threads, 1)
        check_int("seed", self.seed, None)
        check_int("retry_attempts", self.retry_attempts, 1)
        for name in ("run_timeout_s", "metric_timeout_s"):
            check_number(name, getattr(self, name), 0, math.inf, low_open=True, optional=True)
        check_executor(self.executor)


@dataclass(frozen=True)
class OutputOptions:
    """What a run shows and records beyond its result; none of these changes a decision.

    progress: the progress bar.
    verbose: each candidate's gradient and instruction in the log.
    track_stats: attach the run's record to the returned program as ``detailed_results``.
    use_mlflow: log the compile to MLflow.
    use_wandb, wandb_api_key, wandb_init_kwargs: log the compile to Weights & Biases, as dspy.GEPA does.
    resume_despite: parts of a log_dir's run identity allowed to differ on resume ("metric", "task_lm",
        "prompt_lm", "prompts", "adapter", "options").
    """

    progress: bool = True
    verbose: bool = False
    track_stats: bool = True
    use_mlflow: bool = False
    use_wandb: bool = False
    wandb_api_key: str | None = field(default=None, repr=False)
    wandb_init_kwargs: dict[str, Any] | None = None
    resume_despite: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "resume_despite", check_resume_despite(self.resume_despite))
