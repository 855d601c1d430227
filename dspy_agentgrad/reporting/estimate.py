"""What a run will cost, before it is paid for: metric calls, LM calls and tokens, USD, wall time.

``AgentGrad.estimate`` runs the program on a few training examples and attributes
their failures (steps 1-2 of a round, paid like a round): that measures what a run
costs (task-LM calls and tokens, seconds), how often it fails, how many hinted runs
a failure takes, and how blame splits over the predictors. At the start of
``compile`` the same projection is logged from the first validation pass alone (no
extra spend; hints and blame then take their defaults: half the predictors plus one,
an even split, and no run reused). A round pays for the batch's runs not cached yet, the hints of its
failures, and per cluster a rewrite checked on the cluster and, when it wins there,
on the validation set; of those checks, the share the sample's hinted runs reused
(output unchanged) is taken to cost no metric call. The projection plays the rounds forward under the assumption
``CLUSTER_WIN_RATE`` and stops where the run stops: ``max_rounds``, the budget, no
failure left, or rounds without a new program run.

It is an estimate, not a bound: the worst case (``worst_case_metric_calls``) is the
``auto`` formula of :func:`dspy_agentgrad.config.auto_budget`.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from ..config import AgentGradConfig
from ..core.clustering import min_cluster_size
from ..core.events import AgentGradCallback, RunStart, ValidationScored
from ..runtime.usage import empty_usage

logger = logging.getLogger("dspy_agentgrad")

CLUSTER_WIN_RATE = 0.5  # share of rewrites that beat the old instruction on their cluster (then validated)
ROLE_OVERHEAD_TOKENS = 300  # a prompt-LM role's own instructions and field names
ROLE_COMPLETION_TOKENS = 150  # a gradient, a cluster list or an instruction
MAX_PROJECTED_ROUNDS = 100  # when only max_metric_calls bounds the run


@dataclass
class SampleStats:
    """What the sample runs measured (totals over ``runs``)."""

    runs: int  # program runs, hinted ones included
    failure_rate: float
    task_usage: dict[str, int] = field(default_factory=empty_usage)
    seconds: float = 0.0
    hints_per_failure: float | None = None  # hinted runs per failure, when attribution was sampled
    blame: dict[str, float] | None = None  # share of failures attributed to each predictor, likewise
    # share of hinted runs whose output came out as the unhinted run's (their score reused, no metric
    # call): how often a change to one predictor leaves the program's output as it was
    reuse_rate: float = 0.0

    def per_run(self, key: str) -> float:
        """The sample's mean task-LM usage ``key`` per program run."""
        return self.task_usage.get(key, 0) / self.runs if self.runs else 0.0


@dataclass
class Estimate:
    """A projected run. USD is None when a model has no price in litellm's table (see ``unpriced``)."""

    metric_calls: int
    worst_case_metric_calls: int
    max_metric_calls: int | None
    rounds: int
    task_lm_calls: int
    task_tokens: int
    prompt_lm_calls: int
    prompt_tokens: int
    usd: float | None
    unpriced: list[str]
    wall_time_s: float
    num_threads: int
    sample: SampleStats

    def to_dict(self) -> dict:
        """A JSON-ready form, for logs and tools."""
        return asdict(self)

    def summary(self) -> str:
        """One line a person reads before deciding to pay for the run."""
        cap = f" (cap {self.max_metric_calls})" if self.max_metric_calls else ""
        usd = f"${self.usd:.2f}" if self.usd is not None else f"unpriced ({', '.join(self.unpriced)})"
        return (
            f"AgentGrad estimate: ~{self.metric_calls} metric calls{cap} over ~{self.rounds} rounds "
            f"(worst case {self.worst_case_metric_calls}); task LM ~{self.task_lm_calls} calls, "
            f"~{self.task_tokens} tokens; prompt LM ~{self.prompt_lm_calls} calls, ~{self.prompt_tokens} tokens; "
            f"cost {usd}; wall time ~{self.wall_time_s:.0f} s at num_threads={self.num_threads} "
            f"(from {self.sample.runs} sample runs, failure rate {self.sample.failure_rate:.2f})"
        )


@dataclass
class _Tally:
    metric_calls: float = 0.0
    prompt_calls: float = 0.0
    rounds: int = 0


def project_calls(
    config: AgentGradConfig,
    predictors: list[str],
    trainable: set[str],
    n_train: int,
    n_val: int,
    max_metric_calls: int | None,
    max_rounds: int | None,
    sample: SampleStats,
) -> _Tally:
    """Metric calls and prompt-LM calls of the rounds played forward from what the sample measured.

    Expected values per round: the batch's examples not yet run under the current instructions
    (runs are cached until an accepted rewrite changes the program), their failures and hints,
    and per trainable predictor a candidate when its share of the gradients (plus those waiting
    from earlier rounds) reaches the round's minimum cluster size.
    """
    batch = min(config.train_batch_size, n_train)
    hints = sample.hints_per_failure if sample.hints_per_failure is not None else (len(predictors) + 1) / 2
    blame = sample.blame if sample.blame is not None else {name: 1 / len(predictors) for name in predictors}
    waiting = dict.fromkeys(predictors, 0.0)  # gradients below the minimum wait for a later round
    tally = _Tally(metric_calls=n_val)
    rate, seen, idle = sample.failure_rate, 0.0, 0
    limit = max_rounds if max_rounds is not None else MAX_PROJECTED_ROUNDS
    while tally.rounds < limit:
        if rate * batch < 0.5 and batch == n_train:
            break  # the engine stops: no failure left on the training set
        fresh = max(0.0, min(batch, n_train - seen))
        failures = rate * fresh
        minimum = min_cluster_size(config.cluster_schedule, tally.rounds)
        spent, gradients, candidates, fixed_share = fresh + failures * hints, 0.0, 0, 0.0
        for name in [n for n in predictors if n in trainable]:
            pool = blame.get(name, 0.0) * failures + waiting[name]
            gradients += blame.get(name, 0.0) * failures
            if pool >= max(minimum, 0.5):
                # its cluster under the rewrite; under the current program again when an earlier rewrite
                # of the round changed it; the validation set when it wins on its cluster
                spent += (1 - sample.reuse_rate) * (pool + CLUSTER_WIN_RATE * (pool + n_val))
                candidates, fixed_share, waiting[name] = candidates + 1, fixed_share + blame.get(name, 0.0), 0.0
            else:
                waiting[name] = pool
        if max_metric_calls is not None and tally.metric_calls + spent > max_metric_calls:
            tally.metric_calls, tally.rounds = max_metric_calls, tally.rounds + 1  # stops at the step that won't fit
            break
        tally.metric_calls += spent
        tally.prompt_calls += gradients + min(len(trainable), gradients) + candidates  # gradients, grouping, rewrites
        tally.rounds += 1
        rate *= 1 - CLUSTER_WIN_RATE * fixed_share  # an accepted rewrite fixes the failures blamed on its predictor
        seen = min(n_train, seen + fresh) * (1 - CLUSTER_WIN_RATE) ** candidates
        idle = idle + 1 if fresh < 0.5 else 0
        if idle >= len(config.cluster_schedule):
            break  # the engine stops: rounds without a new program run
    return tally


def build_estimate(
    config: AgentGradConfig,
    sample: SampleStats,
    *,
    predictors: list[str],
    trainable: set[str],
    n_train: int,
    n_val: int,
    max_metric_calls: int | None,
    max_rounds: int | None,
    worst_case: int,
    prices: dict[str, Any],
) -> Estimate:
    """``prices`` maps "task"/"prompt" to a usage -> USD function, or to None when unpriced."""
    tally = project_calls(config, predictors, trainable, n_train, n_val, max_metric_calls, max_rounds, sample)
    runs = round(tally.metric_calls)
    task_usage = {k: round(sample.per_run(k) * runs) for k in ("calls", "prompt_tokens", "completion_tokens")}
    step_tokens = sample.per_run("prompt_tokens") / max(1.0, sample.per_run("calls"))
    prompt_calls = round(tally.prompt_calls)
    prompt_usage = {
        "calls": prompt_calls,
        "prompt_tokens": round(prompt_calls * (ROLE_OVERHEAD_TOKENS + 2 * step_tokens)),
        "completion_tokens": prompt_calls * ROLE_COMPLETION_TOKENS,
    }
    unpriced = [role for role in ("task", "prompt") if prices.get(role) is None]
    usd = None if unpriced else prices["task"](task_usage) + prices["prompt"](prompt_usage)
    seconds_per_run = sample.seconds / sample.runs if sample.runs else 0.0
    seconds_per_lm_call = seconds_per_run / max(1.0, sample.per_run("calls"))
    wall = (runs * seconds_per_run + prompt_calls * seconds_per_lm_call) / config.num_threads
    return Estimate(
        metric_calls=runs,
        worst_case_metric_calls=worst_case,
        max_metric_calls=max_metric_calls,
        rounds=tally.rounds,
        task_lm_calls=task_usage["calls"],
        task_tokens=task_usage["prompt_tokens"] + task_usage["completion_tokens"],
        prompt_lm_calls=prompt_calls,
        prompt_tokens=prompt_usage["prompt_tokens"] + prompt_usage["completion_tokens"],
        usd=usd,
        unpriced=unpriced,
        wall_time_s=wall,
        num_threads=config.num_threads,
        sample=sample,
    )


class StartEstimate(AgentGradCallback):
    """Logs an estimate at the start of ``compile``, measured on the first validation pass (no extra spend).

    ``estimate_from(sample)`` builds the :class:`Estimate`; ``validation_usage()`` returns the
    task-LM usage of that pass. The failure rate is read from the score (exact for 0/1 metrics).
    """

    def __init__(self, estimate_from, validation_usage, max_score: float):
        self.estimate_from = estimate_from
        self.validation_usage = validation_usage
        self.max_score = max_score
        self.started = time.time()
        self.n_val = 0
        self.estimate: Estimate | None = None

    def on_run_start(self, event: RunStart) -> None:
        self.started, self.n_val = time.time(), event.n_val

    def on_validation_scored(self, event: ValidationScored) -> None:
        if event.candidate is not None or self.estimate is not None:
            return
        failure_rate = min(1.0, max(0.0, 1 - event.score / self.max_score))
        sample = SampleStats(self.n_val, failure_rate, dict(self.validation_usage()), time.time() - self.started)
        self.estimate = self.estimate_from(sample)
        logger.info("%s", self.estimate.summary())
