"""The projection of a run's metric and prompt-LM calls: its rounds played forward from what a sample (or the
rounds run so far) measured.

A round pays for the batch's runs not cached yet, the hints of its failures, and per cluster
a rewrite checked on the cluster and, when it wins there, on the validation set (with
``validate_together``, one pass per stack of winners,
which spans ``stack_rounds`` rounds). The projection plays the rounds
forward and stops where the run stops: ``max_rounds``, the budget, no failure left, or rounds
that took nothing from it (:class:`~dspy_agentgrad.core.idle_rounds.IdleRounds`). It counts the metric calls and,
apart from them, the task spend, which the budget bounds too with ``cap_task_spend``: each run adds the share of
its calls it made anew (one for a run never made before). It takes a rewrite that wins on its cluster as
accepted (validation is not sampled). A predictor's first accepted rewrite fixes the held-out share; a later
rewrite of it fixes the rest as the sampled rewrites fixed their own failures (a later batch shows them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..config import AgentGradConfig
from ..core.clustering import min_cluster_size
from ..core.idle_rounds import IdleRounds
from ..runtime.usage import empty_usage

CLUSTER_WIN_RATE = 0.5  # share of rewrites that beat the old instruction on their cluster, when not sampled
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
    # share of the hinted runs that did not fix their failure whose output came out as the unhinted
    # run's (their score reused, no metric call): how often a change to one predictor that does not
    # fix an example leaves the program's output as it was
    reuse_rate: float = 0.0
    reused_hints: float = 0.0  # hinted runs per failure that took their score so (no metric call)
    # the mean share of its calls a run with an earlier run to reuse made anew, scored or not (None: not measured)
    rerun_share: float | None = None
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
class _Cost:
    """Expected metric calls of some runs, and their task spend (calls made anew, in metric calls)."""

    metric_calls: float = 0.0
    task: float = 0.0

    def __add__(self, other: _Cost) -> _Cost:
        return _Cost(self.metric_calls + other.metric_calls, self.task + other.task)


def _runs(n: float, paid: float, rerun: float) -> _Cost:
    """``n`` runs with an earlier run to reuse, of which ``paid`` (a share) are scored (the others take the
    earlier score); each makes ``rerun`` of its calls anew."""
    return _Cost(n * paid, n * rerun)


@dataclass
class _Tally:
    metric_calls: float = 0.0
    prompt_calls: float = 0.0
    rounds: int = 0
    task: float = 0.0  # the task spend
    capped_task: bool = False  # whether the budget bounds the task spend too (``cap_task_spend``)

    def counted(self, cost: _Cost) -> list[tuple[float, float]]:
        """(so far, more) for each count the budget bounds."""
        pairs = [(self.metric_calls, cost.metric_calls)]
        return pairs + [(self.task, cost.task)] if self.capped_task else pairs

    def room(self, cap: int | None) -> float:
        """What ``cap`` leaves of the counts it bounds (infinite without a cap)."""
        return float("inf") if cap is None else max(0.0, cap - max(paid for paid, _ in self.counted(_Cost())))

    def part(self, cost: _Cost, cap: int | None) -> float:
        """The share of ``cost`` that ``cap`` leaves room for (1: all of it)."""
        room = [1.0] + [max(0.0, cap - paid) / more for paid, more in self.counted(cost) if cap is not None and more]
        return min(room)

    def take(self, cost: _Cost, cap: int | None) -> bool:
        """Add ``cost``, or the part of it that ``cap`` leaves room for (the engine stops at the step that does
        not fit); whether all of it fit."""
        part = self.part(cost, cap)
        self.metric_calls += cost.metric_calls * part
        self.task += cost.task * part
        return part == 1.0


@dataclass
class RunSoFar:
    """Where a run stands after some rounds, for a projection of the rest (see :class:`.estimate.StartEstimate`)."""

    rounds: int
    metric_calls: int
    rates: dict[str, float]  # the last batch's failures blamed on each predictor, per example, after its rewrites
    hard: float  # the last batch's hard cases per example
    current: float  # training examples run under the current instructions
    ever: float  # training examples run at all
    win_rate: float  # share of rewrites that won on their cluster so far (shrunk toward CLUSTER_WIN_RATE)
    stacked: float = 0.0  # failures per example blamed on the winners waiting for their validation pass
    stacked_winners: int = 0  # those winners (``stack_rounds``)
    task_spend: float | None = None  # the task spend so far (None: as the metric calls)


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
    changes (``1 - reuse_rate``); each makes the sampled ``rerun_share`` of its calls anew (task spend).
    Their failures are hinted (a cached failure's hints are free).
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
    # a run with an earlier run to reuse makes its calls anew from the predictor that differs on: when not
    # measured, from a predictor in the middle of the chain on
    rerun = sample.rerun_share if sample.rerun_share is not None else (len(predictors) + 1) / (2 * len(predictors))
    waiting = dict.fromkeys(predictors, 0.0)  # gradients below the minimum wait for a later round
    capped = config.budget.cap_task_spend
    tally = _Tally(metric_calls=n_val, task=n_val, capped_task=capped)
    # failure rates: per predictor (fixable by rewriting it) and of the hard cases (no rewrite fixes them)
    rates = {name: sample.failure_rate * blame.get(name, 0.0) for name in predictors}
    hard = sample.failure_rate * max(0.0, 1 - sum(blame.values()))
    current, ever = 0.0, 0.0
    idle = IdleRounds(len(config.abstraction.cluster_schedule), config.budget.cap_task_spend)
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
        task = so_far.metric_calls if so_far.task_spend is None else so_far.task_spend
        tally = _Tally(metric_calls=so_far.metric_calls, rounds=so_far.rounds, task=task, capped_task=capped)
        rates, hard = {name: so_far.rates.get(name, 0.0) for name in predictors}, so_far.hard
        current, ever, win = so_far.current, so_far.ever, so_far.win_rate
        stack = [so_far.stacked, float(so_far.stacked_winners)]
    limit = max_rounds if max_rounds is not None else MAX_PROJECTED_ROUNDS
    while tally.rounds < limit:
        fresh = max(0.0, min(batch, n_train - current))  # the batch's examples not run under this program
        new = max(0.0, min(fresh, n_train - ever))
        runs = _Cost(new, new) + _runs(fresh - new, change, rerun)
        if (hard + sum(rates.values())) * batch < 0.5 and batch == n_train:
            # the engine runs the batch, finds no failure left on the training set, and stops
            tally.take(runs, max_metric_calls)
            tally.rounds += 1
            break
        if sum(rates.values()) * batch + sum(waiting.values()) < 0.5:
            # no gradient left to learn from: the engine runs the rest of the training set under the
            # final program, then stops after rounds that took nothing from the budget
            rest = n_train - current
            sweep = math.ceil(rest / batch - 0.01) + len(config.abstraction.cluster_schedule)
            unseen = max(0.0, n_train - ever)
            rest = min(rest, tally.room(max_metric_calls))  # as many examples as the budget has calls left
            tally.take(_Cost(unseen, unseen) + _runs(rest - unseen, change, rerun), max_metric_calls)
            tally.rounds = min(limit, tally.rounds + sweep)
            break
        failing = sum(rates.values()) * fresh
        spent = runs + _Cost(failing * hints, failing * (hints + sample.reused_hints) * rerun)
        minimum = min_cluster_size(config.abstraction.cluster_schedule, tally.rounds)
        gradients, candidates, stacked = 0.0, 0.0, 0.0
        for name in [n for n in predictors if n in trainable]:
            pool = rates[name] * batch + waiting[name]
            gradients += rates[name] * batch
            if pool < max(minimum, 0.5):
                waiting[name] = pool
                continue
            # its cluster under the rewrite; the validation set when it wins there (alone, or in the round's
            # one shared pass under ``validate_together``): the examples whose output the rewrite changes are
            # scored
            # a losing rewrite proposed again is judged on runs paid for already once the batch holds no new run
            cached = (1 - win) * repeat if fresh < 0.5 else 0.0
            spent += _runs(pool * (1 - cached), check, rerun)
            if not config.judging.validate_together:
                spent += _runs(win * n_val, rates[name] + (1 - rates[name]) * change, rerun)
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
                spent += _stack_pass(n_val, win, change, rerun, stack[0], stack[1])
                stack = [0.0, 0.0]
        if not tally.take(spent, max_metric_calls):
            tally.rounds += 1  # stops at the step that won't fit
            break
        tally.prompt_calls += gradients + min(len(trainable), gradients) + candidates  # gradients, grouping, rewrites
        tally.rounds += 1
        ever = min(n_train, ever + fresh)
        current = min(n_train, current + fresh) * (1 - win) ** candidates
        if idle.stops_after(sum(more for _, more in tally.counted(spent)) >= 0.5):
            break  # the engine stops: rounds that took nothing from the budget
    last = _stack_pass(n_val, win, change, rerun, stack[0], stack[1]) if stack[1] else _Cost()
    if tally.part(last, max_metric_calls) == 1.0:
        tally.take(last, max_metric_calls)  # the engine validates a stack still waiting when the run ends
    return tally


def _stack_pass(n_val: int, win: float, change: float, rerun: float, stacked: float, candidates: float) -> _Cost:
    """Expected cost of one validation pass when any candidate of a stack wins its cluster, on the stack of the
    winners: its output changes on the failures of every winner's predictor (each wins with ``win``), and on the
    other examples when a change shows (as one candidate's pass); each run makes ``rerun`` of its calls anew."""
    fixed = win * min(1.0, stacked)
    made = 1 - (1 - win) ** candidates  # the pass is made when a candidate of the stack wins
    return _runs(n_val * fixed, 1.0, rerun) + _runs(n_val * (1 - fixed) * made, change, rerun)
