"""The stop for a run that can learn nothing more: rounds in a row that spent nothing of the budget.

A round spends when it runs something not run before: a scored run is a metric call, and a run that takes
an earlier run's score is charged the share of its calls it made again (:attr:`.runs.Outcome.budget_share`).
A round that spent nothing ran only what it had run before and got the answers it got before, so the next
round, with the same program, asks the same again; once a whole cluster schedule of rounds (every minimum
cluster size) has passed that way, no round can propose anything new and the run stops.

A round that made runs, even runs whose outputs came out as before, is not idle: those runs are paid from
the budget like any other, and ``max_metric_calls`` bounds them. The rule therefore never ends a run that
still spends, and a run that spends without gain ends at its budget, as ``dspy.GEPA``'s does. The engine
and the projection (:mod:`dspy_agentgrad.reporting.projection`) both decide with this object.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class IdleRounds:
    """Counts the rounds in a row that spent nothing; ``limit`` of them (the cluster schedule's length) stop the
    run."""

    limit: int
    count: int = 0

    def stops_after(self, spent: bool) -> bool:
        """Count a round that ``spent`` something (or not); whether the run stops after it."""
        self.count = 0 if spent else self.count + 1
        return self.count >= self.limit

    @property
    def reason(self) -> str:
        rounds = "1 round" if self.count == 1 else f"{self.count} rounds in a row"
        return f"stalled: {rounds} spent nothing (every run asked for was paid already)"
