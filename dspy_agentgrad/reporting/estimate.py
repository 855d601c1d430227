"""What a run will cost, before it is paid for: metric calls, LM calls and tokens, USD, wall time.

``AgentGrad.estimate`` pays for one round in small on a few training examples (see
:mod:`dspy_agentgrad.sampling`): their runs and hinted runs measure what a run costs (task-LM calls and
tokens, seconds), how often it fails, how many hinted runs a failure takes, how blame splits
over the predictors and how often a run is reused; one rewrite per blamed predictor measures
how often a rewrite wins on its cluster, how much of its predictor's failures it fixes, and
what share of the runs under it cost a metric call; the stack of winners, run on as many held-out
training examples, measures how much of their fix reaches failures they were not written from.
At the start of ``compile`` the same projection is logged from the first validation pass alone
(no extra spend; hints and blame then take their defaults: half the predictors plus one, an even
split, no run reused, and ``CLUSTER_WIN_RATE`` of the rewrites winning and fixing all their predictor's failures).

It is an estimate, not a bound: the worst case (``worst_case_metric_calls``) is the
``auto`` formula of :func:`dspy_agentgrad.option_groups.auto_budget`.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass
from typing import Any

from ..config import AgentGradConfig
from ..core.events import (
    AgentGradCallback,
    AttributionDone,
    CandidateJudged,
    RoundEnd,
    RoundStart,
    RunStart,
    ValidationScored,
)
from ..core.round_rules import RoundRules
from .projection import CLUSTER_WIN_RATE, RunShape, RunSoFar, SampleStats, project_calls

logger = logging.getLogger("dspy.agentgrad")

ROLE_OVERHEAD_TOKENS = 300  # a prompt-LM role's own instructions and field names
ROLE_COMPLETION_TOKENS = 150  # a gradient, a cluster list or an instruction
SAMPLE_SIZE = 8  # training examples ``AgentGrad.estimate`` and ``agentgrad estimate`` run by default


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
            f"cost {usd}; wall time ~{self.wall_time_s:.0f} s at num_threads={self.num_threads} ({self._basis()})"
        )

    def _basis(self) -> str:
        s = self.sample
        if not s.examples:
            return (
                f"from the validation pass: {s.failure_rate:.0%} of {s.runs} examples failed; hints, blame and "
                "reuse not measured yet, projected again at each round end"
            )
        rewrites = f"no rewrite tried: {CLUSTER_WIN_RATE:.0%} assumed to win, each fixing its predictor's failures"
        if s.rewrites:
            rewrites = f"{s.rewrite_wins} of {s.rewrites} rewrites (one per blamed predictor) won on their cluster"
        if s.fix_share is not None:
            rewrites += f", fixing {s.fix_share:.0%} of their predictors' sampled failures"
        if s.repeat_share is not None:
            rewrites += f"; the rewrite role proposed {s.repeat_share:.0%} of the losers again when shown their loss"
        unseen = "failures unlike the sampled ones"
        if s.carry_over is not None:
            rewrites += f" and {s.carry_over:.0%} as large a share of held-out training examples' failures"
            unseen = "how fast later rounds fix what the first ones miss"
        return (
            f"from {s.examples} sampled training examples, which paid {s.paid_metric_calls} metric calls and "
            f"{s.paid_prompt_calls} prompt-LM calls: {s.failure_rate:.0%} failed, {s.reuse_rate:.0%} of the hinted "
            f"runs that fixed nothing were reused, {rewrites}; not measured: validation (a rewrite that wins on its "
            f"cluster is taken as accepted) and {unseen}"
        )


def build_estimate(
    config: AgentGradConfig,
    sample: SampleStats,
    run: RunShape,
    *,
    worst_case: int,
    prices: dict[str, Any],
    so_far: RunSoFar | None = None,
) -> Estimate:
    """``prices`` maps "task"/"prompt" to a usage -> USD function, or to None when unpriced."""
    tally = project_calls(RoundRules.of(config), run, sample, so_far)
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
    wall = (runs * seconds_per_run + prompt_calls * seconds_per_lm_call) / config.execution.num_threads
    return Estimate(
        metric_calls=runs,
        worst_case_metric_calls=worst_case,
        max_metric_calls=run.max_metric_calls,
        rounds=tally.rounds,
        task_lm_calls=task_usage["calls"],
        task_tokens=task_usage["prompt_tokens"] + task_usage["completion_tokens"],
        prompt_lm_calls=prompt_calls,
        prompt_tokens=prompt_usage["prompt_tokens"] + prompt_usage["completion_tokens"],
        usd=usd,
        unpriced=unpriced,
        wall_time_s=wall,
        num_threads=config.execution.num_threads,
        sample=sample,
    )


class StartEstimate(AgentGradCallback):
    """Logs an estimate at the start of ``compile``, measured on the first validation pass (no extra spend),
    and projects the run again at each round end from what the rounds measured (:meth:`total`).

    ``estimate_from(sample, so_far=None)`` builds the :class:`Estimate`; ``validation_usage()``
    returns the task-LM usage of that pass. The failure rate is read from the score (exact for 0/1
    metrics). The first round's attribution, when the validation pass was over before it began,
    is measured as ``AgentGrad.estimate`` measures its sample (hinted runs per failure, blame,
    reuse; ``reused()`` counts the runs reused so far). A round end measures the failures blamed on
    each predictor in its batch (those of a predictor whose rewrite the round kept count as fixed),
    its hard cases, and the share of rewrites that won on their cluster so far.
    """

    def __init__(
        self,
        estimate_from,
        validation_usage,
        score_range: tuple[float, float],
        reused=lambda: 0,
        charged=lambda: 0,
    ):
        self.estimate_from = estimate_from
        self.validation_usage = validation_usage
        self.score_range = score_range  # (failure_score, max_score): a mean score's place between them
        self.reused = reused
        self.charged = charged  # the runs' task spend so far (``Budget.task_spend``)
        self.sample: SampleStats | None = None  # what the projections at round ends start from
        # metric calls, reused runs and task spend when round 0 began
        self.first_round: tuple[int, int, float] | None = None
        self.started = time.time()
        self.n_train = self.n_val = 0
        self.estimate: Estimate | None = None
        self.projected: int | None = None
        self.current = self.ever = 0.0
        self.cluster_wins = self.candidates = 0
        self.kept: set[str] = set()

    def on_run_start(self, event: RunStart) -> None:
        self.started, self.n_train, self.n_val = time.time(), event.n_train, event.n_val

    def on_validation_scored(self, event: ValidationScored) -> None:
        if event.candidate is not None or self.estimate is not None:
            return
        low, top = self.score_range
        failure_rate = min(1.0, max(0.0, (top - event.score) / (top - low)))
        sample = SampleStats(self.n_val, failure_rate, dict(self.validation_usage()), time.time() - self.started)
        self.estimate, self.sample = self.estimate_from(sample), sample
        self.projected = self.estimate.metric_calls
        logger.info("%s", self.estimate.summary())

    def on_round_start(self, event: RoundStart) -> None:
        if event.round == 0 and self.estimate is not None:  # validated before: the round's calls are its own
            self.first_round = (event.metric_calls, self.reused(), self.charged())

    def on_attribution(self, event: AttributionDone) -> None:
        if event.round != 0 or self.first_round is None or self.sample is None or not event.failures:
            return
        first_metric_calls, first_reused, first_charged = self.first_round
        self.sample = SampleStats.of_attribution(
            len(event.report.passed) + event.failures,
            event.failures,
            event.report.counts(),
            event.metric_calls - first_metric_calls,
            self.reused() - first_reused,
            self.charged() - first_charged,
            task_usage=self.sample.task_usage,
            seconds=self.sample.seconds,
        )

    def _judged(self, event: CandidateJudged) -> None:
        c = event.candidate
        self.candidates += 1
        self.cluster_wins += c.cluster_score_after is not None and c.cluster_score_after > (c.cluster_score_before or 0)
        if c.accepted:
            self.kept.add(c.predictor)

    on_candidate_accepted = _judged
    on_candidate_rejected = _judged

    def on_round_end(self, event: RoundEnd) -> None:
        r = event.record
        batch = max(1, r.batch_size)
        self.ever = min(self.n_train, self.ever + batch)
        self.kept |= set(r.stacked)  # in place for the next round, as if accepted
        self.current = 0.0 if self.kept else min(self.n_train, self.current + batch)
        if self.estimate is not None:
            so_far = RunSoFar(
                rounds=r.round + 1,
                metric_calls=r.metric_calls,
                rates={name: 0.0 if name in self.kept else n / batch for name, n in r.attributed.items()},
                hard=r.hard_cases / batch,
                current=self.current,
                ever=self.ever,
                win_rate=(self.cluster_wins + 2 * CLUSTER_WIN_RATE) / (self.candidates + 2),
                stacked=sum(n / batch for name, n in r.attributed.items() if name in r.stacked),
                stacked_winners=len(r.stacked),
                task_spend=float(self.charged()),
            )
            self.projected = max(r.metric_calls, self.estimate_from(self.sample, so_far).metric_calls)
        self.kept = set()

    def total(self) -> int | None:
        """The run's projected metric calls; None before the first validation pass."""
        return self.projected
