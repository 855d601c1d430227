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

A round pays for the batch's runs not cached yet, the hints of its failures, and per cluster
a rewrite checked on the cluster and, when it wins there, on the validation set (with
``validate_together``, one pass per stack of winners,
which spans ``stack_rounds`` rounds). The projection plays the rounds
forward and stops where the run stops: ``max_rounds``, the budget, no failure left, or rounds
without a new program run. It takes a rewrite that wins on its cluster as accepted (validation
is not sampled). A predictor's first accepted rewrite fixes the held-out share; a later rewrite of it
fixes the rest as the sampled rewrites fixed their own failures (a later batch shows them).

It is an estimate, not a bound: the worst case (``worst_case_metric_calls``) is the
``auto`` formula of :func:`dspy_agentgrad.option_groups.auto_budget`.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from ..config import AgentGradConfig
from ..core.clustering import min_cluster_size
from ..core.events import (
    AgentGradCallback,
    AttributionDone,
    CandidateJudged,
    RoundEnd,
    RoundStart,
    RunStart,
    ValidationScored,
)
from ..runtime.usage import empty_usage

logger = logging.getLogger("dspy.agentgrad")

CLUSTER_WIN_RATE = 0.5  # share of rewrites that beat the old instruction on their cluster, when not sampled
ROLE_OVERHEAD_TOKENS = 300  # a prompt-LM role's own instructions and field names
ROLE_COMPLETION_TOKENS = 150  # a gradient, a cluster list or an instruction
MAX_PROJECTED_ROUNDS = 100  # when only max_metric_calls bounds the run
SAMPLE_SIZE = 8  # training examples ``AgentGrad.estimate`` and ``agentgrad estimate`` run by default


@dataclass
class SampleStats:
    """What the sample runs measured (totals over ``runs``)."""

    runs: int  # program runs, hinted ones included
    failure_rate: float
    task_usage: dict[str, int] = field(default_factory=empty_usage)
    seconds: float = 0.0
    hints_per_failure: float | None = None  # hinted runs per failure, when attribution was sampled
    blame: dict[str, float] | None = None  # share of failures attributed to each predictor, likewise
    # share of the hinted runs that did not fix their failure whose output came out as the unhinted
    # run's (their score reused, no metric call): how often a change to one predictor that does not
    # fix an example leaves the program's output as it was
    reuse_rate: float = 0.0
    examples: int = 0  # training examples sampled (0: the projection at the start of compile, from validation)
    # ``AgentGrad.estimate`` also tries one rewrite per blamed predictor (see :mod:`dspy_agentgrad.sampling`)
    rewrites: int = 0  # rewrites tried
    rewrite_wins: int = 0  # of those, the ones that beat the program on their cluster
    fix_share: float | None = None  # share of a winner's predictor's sampled failures its rewrite fixed
    check_paid: float | None = None  # share of the runs under a rewrite that paid a metric call
    # held-out failures the winners fixed, as a share of the sampled failures they fixed (capped at 1):
    # how much of a first rewrite's fix reaches the failures it was not written from; None when not measured
    carry_over: float | None = None
    # share of the losing rewrites that the rewrite role, shown its loss, proposed again word for word
    repeat_share: float | None = None
    paid_metric_calls: int = 0  # what the sample paid, all of it
    paid_prompt_calls: int = 0

    @property
    def win_rate(self) -> float | None:
        """Share of the tried rewrites that won on their cluster; None when none was tried."""
        return self.rewrite_wins / self.rewrites if self.rewrites else None

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


@dataclass
class _Tally:
    metric_calls: float = 0.0
    prompt_calls: float = 0.0
    rounds: int = 0


@dataclass
class RunSoFar:
    """Where a run stands after some rounds, for a projection of the rest (see :class:`StartEstimate`)."""

    rounds: int
    metric_calls: int
    rates: dict[str, float]  # the last batch's failures blamed on each predictor, per example, after its rewrites
    hard: float  # the last batch's hard cases per example
    current: float  # training examples run under the current instructions
    ever: float  # training examples run at all
    win_rate: float  # share of rewrites that won on their cluster so far (shrunk toward CLUSTER_WIN_RATE)
    stacked: float = 0.0  # failures per example blamed on the winners waiting for their validation pass
    stacked_winners: int = 0  # those winners (``stack_rounds``)


def project_calls(
    config: AgentGradConfig,
    predictors: list[str],
    trainable: set[str],
    n_train: int,
    n_val: int,
    max_metric_calls: int | None,
    max_rounds: int | None,
    sample: SampleStats,
    so_far: RunSoFar | None = None,
) -> _Tally:
    """Metric calls and prompt-LM calls of the rounds played forward from what the sample measured
    (from the start, or from ``so_far``: the rounds run, with the rates they measured).

    Expected values per round. The batch's examples not yet run under the current instructions
    are run: one metric call for an example never run, for one run before only when its output
    changes (``1 - reuse_rate``). Their failures are hinted (a cached failure's hints are free).
    Per trainable predictor a candidate when its share of the batch's failures (plus those waiting
    from earlier rounds) reaches the round's minimum cluster size; its check runs the cluster under
    the rewrite (the sampled share of such runs that paid a metric call) and, when it wins there
    (the sampled win share, else ``CLUSTER_WIN_RATE``), the validation examples whose output the
    rewrite changes: those failing for that predictor, and the others when a change shows. A
    winner fixes the sampled share of its predictor's failures (all of them when not sampled).
    """
    batch = min(config.attribution.train_batch_size, n_train)
    hints = sample.hints_per_failure if sample.hints_per_failure is not None else (len(predictors) + 1) / 2
    blame = sample.blame if sample.blame is not None else {name: 1 / len(predictors) for name in predictors}
    change = 1 - sample.reuse_rate  # a run under another program, not fixed by it: share whose output changes
    waiting = dict.fromkeys(predictors, 0.0)  # gradients below the minimum wait for a later round
    tally = _Tally(metric_calls=n_val)
    # failure rates: per predictor (fixable by rewriting it) and of the hard cases (no rewrite fixes them)
    rates = {name: sample.failure_rate * blame.get(name, 0.0) for name in predictors}
    hard = sample.failure_rate * max(0.0, 1 - sum(blame.values()))
    current, ever, idle = 0.0, 0.0, 0
    stack = [0.0, 0.0]  # winners' failure share and candidates of the stack waiting for its pass
    win = sample.win_rate if sample.win_rate is not None else CLUSTER_WIN_RATE
    fix = sample.fix_share if sample.fix_share is not None else 1.0  # of its predictor's failures, when it wins
    # a predictor's first rewrite fixes that share of its failures: those like the ones it was written from; the
    # others (defects its batch did not show, or hid behind an earlier step's) a later batch shows, and a later
    # rewrite of it fixes them as the sample's rewrites fixed theirs
    first_fix = fix * (sample.carry_over if sample.carry_over is not None else 1.0)
    rewritten: set[str] = set()
    check = sample.check_paid if sample.check_paid is not None else 1.0  # of a cluster's runs under a rewrite
    repeat = sample.repeat_share if sample.repeat_share is not None else 0.0
    if so_far is not None:
        tally = _Tally(metric_calls=so_far.metric_calls, rounds=so_far.rounds)
        rates, hard = {name: so_far.rates.get(name, 0.0) for name in predictors}, so_far.hard
        current, ever, win = so_far.current, so_far.ever, so_far.win_rate
        stack = [so_far.stacked, float(so_far.stacked_winners)]
    limit = max_rounds if max_rounds is not None else MAX_PROJECTED_ROUNDS
    while tally.rounds < limit:
        fresh = max(0.0, min(batch, n_train - current))  # the batch's examples not run under this program
        new = max(0.0, min(fresh, n_train - ever))
        runs = new + (fresh - new) * change
        if (hard + sum(rates.values())) * batch < 0.5 and batch == n_train:
            # the engine runs the batch, finds no failure left on the training set, and stops
            room = max_metric_calls - tally.metric_calls if max_metric_calls is not None else runs
            tally.metric_calls, tally.rounds = tally.metric_calls + min(runs, max(0.0, room)), tally.rounds + 1
            break
        if sum(rates.values()) * batch + sum(waiting.values()) < 0.5:
            # no gradient left to learn from: the engine runs the rest of the training set under the
            # final program, then stops after rounds without a metric call
            rest = n_train - current
            sweep = math.ceil(rest / batch - 0.01) + len(config.abstraction.cluster_schedule)
            if max_metric_calls is not None:
                rest = min(rest, max(0.0, max_metric_calls - tally.metric_calls))
            tally.metric_calls += max(0.0, n_train - ever) + (rest - max(0.0, n_train - ever)) * change
            tally.rounds = min(limit, tally.rounds + sweep)
            break
        spent = runs + sum(rates.values()) * fresh * hints
        minimum = min_cluster_size(config.abstraction.cluster_schedule, tally.rounds)
        gradients, candidates, stacked = 0.0, 0.0, 0.0
        for name in [n for n in predictors if n in trainable]:
            pool = rates[name] * batch + waiting[name]
            gradients += rates[name] * batch
            if pool < max(minimum, 0.5):
                waiting[name] = pool
                continue
            changed_val = n_val * (rates[name] + (1 - rates[name]) * change)
            # its cluster under the rewrite; the validation set when it wins there (alone, or in the round's
            # one shared pass under ``validate_together``)
            # a losing rewrite proposed again is judged on runs paid for already once the batch holds no new run
            cached = (1 - win) * repeat if fresh < 0.5 else 0.0
            spent += pool * check * (1 - cached) + (0.0 if config.judging.validate_together else win * changed_val)
            stacked += rates[name]
            candidates, waiting[name] = candidates + 1, 0.0
            # an accepted rewrite fixes (that share of) its predictor's failures
            rates[name] *= 1 - win * (fix if name in rewritten else first_fix)
            rewritten.add(name)
            if rates[name] * n_train < 1:
                rates[name] = 0.0  # not one failure of it left in the training set
        if config.judging.validate_together:  # one pass per window of ``stack_rounds`` rounds with a winner
            stack = [stack[0] + stacked, stack[1] + candidates]
            if stack[1] and (tally.rounds + 1) % config.judging.stack_rounds == 0:
                spent += _stack_pass(n_val, win, change, stack[0], stack[1])
                stack = [0.0, 0.0]
        if max_metric_calls is not None and tally.metric_calls + spent > max_metric_calls:
            tally.metric_calls, tally.rounds = max_metric_calls, tally.rounds + 1  # stops at the step that won't fit
            break
        tally.metric_calls += spent
        tally.prompt_calls += gradients + min(len(trainable), gradients) + candidates  # gradients, grouping, rewrites
        tally.rounds += 1
        ever = min(n_train, ever + fresh)
        current = min(n_train, current + fresh) * (1 - win) ** candidates
        idle = idle + 1 if spent < 0.5 else 0
        if idle >= len(config.abstraction.cluster_schedule):
            break  # the engine stops: rounds without a new program run
    last = _stack_pass(n_val, win, change, stack[0], stack[1]) if stack[1] else 0.0
    if max_metric_calls is None or tally.metric_calls + last <= max_metric_calls:
        tally.metric_calls += last  # the engine validates a stack still waiting when the run ends
    return tally


def _stack_pass(n_val: int, win: float, change: float, stacked: float, candidates: float) -> float:
    """Expected metric calls of one validation pass when any candidate of a stack wins its cluster, on the stack
    of the winners: its output changes on the failures of every winner's predictor (each wins with ``win``), and
    on the other examples when a change shows (as one candidate's pass)."""
    stacked = min(1.0, stacked)
    return n_val * (win * stacked + (1 - win * stacked) * change * (1 - (1 - win) ** candidates))


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
    so_far: RunSoFar | None = None,
) -> Estimate:
    """``prices`` maps "task"/"prompt" to a usage -> USD function, or to None when unpriced."""
    tally = project_calls(config, predictors, trainable, n_train, n_val, max_metric_calls, max_rounds, sample, so_far)
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
        max_metric_calls=max_metric_calls,
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

    def __init__(self, estimate_from, validation_usage, score_range: tuple[float, float], reused=lambda: 0):
        self.estimate_from = estimate_from
        self.validation_usage = validation_usage
        self.score_range = score_range  # (failure_score, max_score): a mean score's place between them
        self.reused = reused
        self.sample: SampleStats | None = None  # what the projections at round ends start from
        self.first_round: tuple[int, int] | None = None  # metric calls and reused runs when round 0 began
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
            self.first_round = (event.metric_calls, self.reused())

    def on_attribution(self, event: AttributionDone) -> None:
        if event.round != 0 or self.first_round is None or self.sample is None or not event.failures:
            return
        batch = len(event.report.passed) + event.failures
        runs, reused = event.metric_calls - self.first_round[0], self.reused() - self.first_round[1]
        fixed = sum(event.report.counts().values())
        unfixed = runs + reused - batch - fixed
        self.sample = SampleStats(
            runs=runs,
            failure_rate=event.failures / batch,
            task_usage=self.sample.task_usage,
            seconds=self.sample.seconds,
            hints_per_failure=max(0.0, runs - batch) / event.failures,
            blame={name: n / event.failures for name, n in event.report.counts().items()},
            reuse_rate=min(1.0, reused / unfixed) if unfixed > 0 else 0.0,
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
            )
            self.projected = max(r.metric_calls, self.estimate_from(self.sample, so_far).metric_calls)
        self.kept = set()

    def total(self) -> int | None:
        """The run's projected metric calls; None before the first validation pass."""
        return self.projected
