"""The stops for a run that can learn nothing more: rounds in a row that took nothing from the budget
(:class:`IdleRounds`), and, past the budget in task spend, rounds in a row without a validation gain
(:class:`Overdraft`).

What the budget counts is the metric calls, and with ``cap_task_spend`` also the runs' task spend: every run,
scored or not, adds the share of its calls it made anew (:attr:`.runs.Outcome.task_share`). A round that
changed neither ran nothing the cap holds for; once a whole cluster schedule of rounds (every minimum cluster
size) has passed that way, the run stops.

Counting metric calls only, a round whose runs all took an earlier run's score (hints not followed, rewrites
that changed no output) counts as idle although it called the task LM: such rounds end a run with budget left,
and cost task-LM calls the cap never sees. With the task spend counted they are paid from the budget and are
not idle, so the rule ends only a run whose rounds ran nothing anew (every later round would ask the same
again); a run that spends without gain ends at its budget, as ``dspy.GEPA``'s does. The engine and the
projection (:mod:`dspy_agentgrad.reporting.projection`) both decide with this object.

With the cap off, rounds whose runs take earlier scores spend task-LM calls the metric-call budget never sees,
and where the LM rewords every rewrite, some round always pays a metric call or two: a run that has stopped
gaining spends on. :class:`Overdraft` bounds that tail: once the task spend has passed the metric-call budget (as
many program runs made anew as a ``dspy.GEPA`` run of that budget makes), the run stops after
``overdraft_rounds`` rounds in a row that did not raise the best validation score. Before the budget is spent, or
while rounds keep gaining, it never stops a run. It depends on gains, so the projection does not play it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class IdleRounds:
    """Counts the rounds in a row that took nothing from the budget; ``limit`` of them (the cluster schedule's
    length) stop the run. ``task_spend``: whether the budget counts the task spend too."""

    limit: int
    task_spend: bool = False
    count: int = 0

    def stops_after(self, paid: bool) -> bool:
        """Count a round that ``paid`` for something (or not); whether the run stops after it."""
        self.count = 0 if paid else self.count + 1
        return self.count >= self.limit

    @property
    def reason(self) -> str:
        what = "a run made anew" if self.task_spend else "a metric call"
        return f"stalled: {self.count} rounds without {what}"


@dataclass
class Overdraft:
    """Counts the rounds in a row that did not raise the best validation score; once the task spend has reached
    ``budget`` (the metric-call cap), ``limit`` of them stop the run. Either None: it never stops one."""

    limit: int | None
    budget: int | None
    count: int = 0
    best: float | None = None

    def stops_after(self, best: float | None, task_spend: float) -> bool:
        """Count a round that ended with ``best`` validation and ``task_spend`` so far; whether the run stops."""
        gained = best is not None and (self.best is None or best > self.best)
        self.best = best if gained else self.best
        self.count = 0 if gained else self.count + 1
        if self.limit is None or self.budget is None:
            return False
        return task_spend >= self.budget and self.count >= self.limit

    @property
    def reason(self) -> str:
        return f"past the budget in task spend and {self.count} rounds without a validation gain"
