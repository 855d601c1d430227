"""The projection of a run's metric and prompt-LM calls: its rounds played forward from what a sample (or the
rounds run so far) measured.

A round pays for the batch's runs not cached yet, the hints of its failures, and per cluster
a rewrite checked on the cluster and, when it wins there, on the validation set (with
``validate_together``, one pass per stack of winners, which spans ``stack_rounds`` rounds). The projection
plays the rounds forward by the engine's own rules (:class:`~dspy_agentgrad.core.round_rules.RoundRules`: batch
size, minimum cluster size, validation windows) and stops where the run stops: ``max_rounds``, the budget, no
failure left, or rounds that took nothing from the budget (:class:`~dspy_agentgrad.core.idle_rounds.IdleRounds`).
It counts the metric calls and, apart from them, the task spend, which the budget bounds too with
``cap_task_spend``: each run adds the share of its calls it made anew (one for a run never made before). It takes
a rewrite that wins on its cluster as accepted (validation is not sampled). A predictor's first accepted rewrite
fixes the held-out share; a later rewrite of it fixes the rest as the sampled rewrites fixed their own failures (a
later batch shows them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from ..core.idle_rounds import IdleRounds
from ..core.round_rules import RoundRules
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
    reused_hints: float = 0.0  # hinted runs per failure that took their score so (no metric call)
    # the mean share of its calls a run with an earlier run to reuse made anew, scored or not (None: not measured)
    rerun_share: float | None = None
    paid_metric_calls: int = 0  # what the sample paid, all of it
    paid_prompt_calls: int = 0

    @classmethod
    def of_attribution(
        cls, batch: int, failures: int, blamed: dict[str, int], runs: int, reused: int, spend: float, **measured: Any
    ) -> SampleStats:
        """What attributing ``batch`` examples measured: ``failures`` of them failed, ``blamed`` on each predictor;
        ``runs`` paid a metric call and ``reused`` took an earlier run's score, with ``spend`` the task spend of them
        all. The estimate's sample and the first round of a run both measure it so."""
        unfixed = runs + reused - batch - sum(blamed.values())  # hinted runs that fixed nothing
        return cls(
            runs=runs,
            failure_rate=failures / batch,
            hints_per_failure=max(0.0, runs - batch) / failures if failures else None,
            blame={name: n / failures for name, n in blamed.items()} if failures else None,
            reuse_rate=min(1.0, reused / unfixed) if unfixed > 0 else 0.0,
            reused_hints=reused / failures if failures else 0.0,
            # a run with an earlier run to reuse: the mean share of its calls it made anew
            rerun_share=float(spend - batch) / (runs + reused - batch) if runs + reused > batch else None,
            **measured,
        )

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


@dataclass(frozen=True)
class RunShape:
    """What a projection knows of the run besides what was measured: its predictors (``trainable``: those that may be
    rewritten), the sizes of its training and validation sets, and its caps."""

    predictors: list[str]
    trainable: set[str]
    n_train: int
    n_val: int
    max_metric_calls: int | None
    max_rounds: int | None
    cap_task_spend: bool = False  # whether ``max_metric_calls`` bounds the task spend too


def project_calls(rules: RoundRules, run: RunShape, sample: SampleStats, so_far: RunSoFar | None = None) -> _Tally:
    """Metric calls and prompt-LM calls of ``run``'s rounds played forward by ``rules`` from what the sample
    measured (from the start, or from ``so_far``: the rounds run, with the rates they measured).

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
    return _Projection(rules, run, sample, so_far).play()


def _measured(value: float | None, default: float) -> float:
    """``value``, or ``default`` where the sample did not measure it."""
    return value if value is not None else default


@dataclass(frozen=True)
class _Shares:
    """What a round's expected cost reads from the sample: each share, or its default where it was not measured."""

    hints: float  # hinted runs per failure
    change: float  # of the runs under another program that it does not fix, the share whose output changes
    win: float  # of the rewrites, the share that wins on its cluster
    fix: float  # of its predictor's failures, the share a winner fixes
    # a predictor's first rewrite fixes that share of its failures: those like the ones it was written from; the
    # others (defects its batch did not show, or hid behind an earlier step's) a later batch shows, and a later
    # rewrite of it fixes them as the sample's rewrites fixed theirs
    first_fix: float
    check: float  # of a cluster's runs under a rewrite, the share that pays a metric call
    repeat: float  # of the losing rewrites, the share the rewrite role proposes again
    # of its calls, the share a run with an earlier run to reuse makes anew; when not measured, from a predictor in
    # the middle of the chain on
    rerun: float
    reused_hints: float  # hinted runs per failure that take an earlier run's score (no metric call)

    @classmethod
    def of(cls, sample: SampleStats, n_predictors: int) -> _Shares:
        fix = _measured(sample.fix_share, 1.0)
        return cls(
            hints=_measured(sample.hints_per_failure, (n_predictors + 1) / 2),
            change=1 - sample.reuse_rate,
            win=_measured(sample.win_rate, CLUSTER_WIN_RATE),
            fix=fix,
            first_fix=fix * _measured(sample.carry_over, 1.0),
            check=_measured(sample.check_paid, 1.0),
            repeat=_measured(sample.repeat_share, 0.0),
            rerun=_measured(sample.rerun_share, (n_predictors + 1) / (2 * n_predictors)),
            reused_hints=sample.reused_hints,
        )


@dataclass
class _RoundCost:
    """One round's expected cost as its phases add it up: metric calls and task spend, gradients written, candidates
    made, and the failure share blamed on the predictors those candidates rewrite."""

    spent: _Cost
    gradients: float = 0.0
    candidates: float = 0.0
    stacked: float = 0.0


class _Projection:
    """The rounds played forward phase by phase under the round's rules; its fields are what a round reads and
    changes, as expected values."""

    def __init__(self, rules: RoundRules, run: RunShape, sample: SampleStats, so_far: RunSoFar | None):
        self.rules, self.run = rules, run
        self.batch = rules.batch_size(run.n_train)
        self.shares = _Shares.of(sample, len(run.predictors))
        self.waiting = dict.fromkeys(run.predictors, 0.0)  # gradients below the minimum wait for a later round
        self.rewritten: set[str] = set()
        self.idle = IdleRounds(rules.cycle, run.cap_task_spend)
        if so_far is None:
            even = {name: 1 / len(run.predictors) for name in run.predictors}
            blame = sample.blame if sample.blame is not None else even
            self.tally = _Tally(metric_calls=run.n_val, task=run.n_val, capped_task=run.cap_task_spend)
            # failure rates: per predictor (fixable by rewriting it) and of the hard cases (no rewrite fixes them)
            self.rates = {name: sample.failure_rate * blame.get(name, 0.0) for name in run.predictors}
            self.hard = sample.failure_rate * max(0.0, 1 - sum(blame.values()))
            self.current, self.ever = 0.0, 0.0  # training examples run under the current program, and at all
            self.stacked, self.stack_size = 0.0, 0.0  # winners' failure share and candidates of the waiting stack
        else:
            task = so_far.metric_calls if so_far.task_spend is None else so_far.task_spend
            self.tally = _Tally(so_far.metric_calls, rounds=so_far.rounds, task=task, capped_task=run.cap_task_spend)
            self.rates, self.hard = {name: so_far.rates.get(name, 0.0) for name in run.predictors}, so_far.hard
            self.current, self.ever = so_far.current, so_far.ever
            self.shares = replace(self.shares, win=so_far.win_rate)
            self.stacked, self.stack_size = so_far.stacked, float(so_far.stacked_winners)

    def play(self) -> _Tally:
        """Rounds until a stop rule holds, then the pass of a stack still waiting."""
        run, tally = self.run, self.tally
        limit = run.max_rounds if run.max_rounds is not None else MAX_PROJECTED_ROUNDS
        while tally.rounds < limit:
            fresh = max(0.0, min(self.batch, run.n_train - self.current))  # the batch's examples not run under it
            new = max(0.0, min(fresh, run.n_train - self.ever))
            runs = _Cost(new, new) + _runs(fresh - new, self.shares.change, self.shares.rerun)
            failures = (self.hard + sum(self.rates.values())) * self.batch
            if self.rules.no_failure_left(failures, self.batch, run.n_train):
                self._last_round(runs)
                break
            if sum(self.rates.values()) * self.batch + sum(self.waiting.values()) < 0.5:
                self._sweep(limit)
                break
            if not self._round(fresh, runs):
                break
        self._last_stack_pass()
        return tally

    def _last_round(self, runs: _Cost) -> None:
        """The engine runs the batch, finds no failure left on the training set, and stops."""
        self.tally.take(runs, self.run.max_metric_calls)
        self.tally.rounds += 1

    def _sweep(self, limit: int) -> None:
        """No gradient left to learn from: the engine runs the rest of the training set under the final program,
        then stalls (a cycle of the schedule that took nothing from the budget)."""
        run, tally = self.run, self.tally
        rest = run.n_train - self.current
        sweep = math.ceil(rest / self.batch - 0.01) + self.rules.cycle
        rest = min(rest, tally.room(run.max_metric_calls))  # as many examples as the budget has calls left
        never = max(0.0, run.n_train - self.ever)
        tally.take(
            _Cost(never, never) + _runs(rest - never, self.shares.change, self.shares.rerun), run.max_metric_calls
        )
        tally.rounds = min(limit, tally.rounds + sweep)

    def _round(self, fresh: float, runs: _Cost) -> bool:
        """A round with gradients to learn from: the batch's runs and its failures' hints, the candidates, and a
        stack's pass where the round closes its window; False when the run stops at it."""
        run, tally, shares = self.run, self.tally, self.shares
        failing = sum(self.rates.values()) * fresh
        cost = _RoundCost(
            runs + _Cost(failing * shares.hints, failing * (shares.hints + shares.reused_hints) * shares.rerun)
        )
        self._candidates(cost, fresh)
        self._window(cost)
        if not tally.take(cost.spent, run.max_metric_calls):
            tally.rounds += 1  # stops at the step that won't fit
            return False
        # gradients, grouping, rewrites
        tally.prompt_calls += cost.gradients + min(len(run.trainable), cost.gradients) + cost.candidates
        tally.rounds += 1
        self.ever = min(run.n_train, self.ever + fresh)
        self.current = min(run.n_train, self.current + fresh) * (1 - self.shares.win) ** cost.candidates
        return not self.idle.stops_after(sum(more for _, more in tally.counted(cost.spent)) >= 0.5)

    def _candidates(self, cost: _RoundCost, fresh: float) -> None:
        """Per trainable predictor, a candidate when its failures in the batch, with those waiting, reach the round's
        minimum cluster size: its cluster check, and its validation pass when winners are validated alone."""
        run, shares = self.run, self.shares
        minimum = self.rules.minimum(self.tally.rounds)
        for name in [n for n in run.predictors if n in run.trainable]:
            pool = self.rates[name] * self.batch + self.waiting[name]
            cost.gradients += self.rates[name] * self.batch
            if pool < minimum:
                self.waiting[name] = pool
                continue
            # a losing rewrite proposed again is judged on runs paid for already once the batch holds no new run
            cached = (1 - shares.win) * shares.repeat if fresh < 0.5 else 0.0
            # its cluster under the rewrite; the validation set when it wins there (alone, or in its window's pass):
            # the examples whose output the rewrite changes are scored
            cost.spent += _runs(pool * (1 - cached), shares.check, shares.rerun)
            if self.rules.stack_rounds is None:
                changed = self.rates[name] + (1 - self.rates[name]) * shares.change
                cost.spent += _runs(shares.win * run.n_val, changed, shares.rerun)
            cost.stacked += self.rates[name]
            cost.candidates += 1
            self.waiting[name] = 0.0
            self._fix(name)

    def _fix(self, name: str) -> None:
        """An accepted rewrite fixes (that share of) its predictor's failures."""
        shares = self.shares
        self.rates[name] *= 1 - shares.win * (shares.fix if name in self.rewritten else shares.first_fix)
        self.rewritten.add(name)
        if self.rates[name] * self.run.n_train < 1:
            self.rates[name] = 0.0  # not one failure of it left in the training set

    def _window(self, cost: _RoundCost) -> None:
        """With validation windows the round's candidates join the stack, which takes its pass in the round that
        closes the window."""
        if self.rules.stack_rounds is None:
            return
        self.stacked, self.stack_size = self.stacked + cost.stacked, self.stack_size + cost.candidates
        if self.stack_size and self.rules.closes_window(self.tally.rounds):
            cost.spent += self._stack_pass()
            self.stacked, self.stack_size = 0.0, 0.0

    def _last_stack_pass(self) -> None:
        """The engine validates a stack still waiting when the run ends, where the budget allows."""
        last = self._stack_pass() if self.stack_size else _Cost()
        cap = self.run.max_metric_calls
        if self.tally.part(last, cap) == 1.0:
            self.tally.take(last, cap)

    def _stack_pass(self) -> _Cost:
        """Expected cost of one validation pass when any candidate of the stack wins its cluster, on the stack of the
        winners: its output changes on the failures of every winner's predictor (each wins with ``win``), and on the
        other examples when a change shows (as one candidate's pass); each run makes ``rerun`` of its calls anew."""
        win, change, rerun, n_val = self.shares.win, self.shares.change, self.shares.rerun, self.run.n_val
        fixed = win * min(1.0, self.stacked)
        made = 1 - (1 - win) ** self.stack_size  # the pass is made when a candidate of the stack wins
        return _runs(n_val * fixed, 1.0, rerun) + _runs(n_val * (1 - fixed) * made, change, rerun)
