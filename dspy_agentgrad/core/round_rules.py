"""The rules of a round, written once: the engine runs its rounds by them and the projection of a run's cost
(:mod:`dspy_agentgrad.reporting.projection`) plays rounds forward by them.

A round attributes a training batch (every example once per epoch, :class:`~.batches.BatchSampler`). A predictor's
gradients make candidates once a group of them reaches the round's minimum cluster size, which cycles through
``cluster_schedule``; a gradient below it waits, for at most one cycle. Clusters are judged largest first. With
``validate_together`` the winners of a window of ``stack_rounds`` rounds share one validation pass at the window's
last round. Besides ``max_rounds`` and the budget, a run stops when a batch that is the whole training set shows no
failure, or when a whole cycle of rounds in a row took nothing from the budget (:class:`~.idle_rounds.IdleRounds`,
counted over :attr:`RoundRules.cycle`).

The engine counts whole examples and calls; the projection counts expected ones, and a count under one half is
none to both.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..config import AgentGradConfig
from .state import Cluster


@dataclass(frozen=True)
class RoundRules:
    """A run's rounds: batch size, cluster-size schedule, validation windows (``stack_rounds`` is None when each
    round validates its own winners) and the stop rules that read them."""

    cluster_schedule: tuple[int, ...]
    train_batch_size: int
    stack_rounds: int | None

    @classmethod
    def of(cls, config: AgentGradConfig) -> RoundRules:
        judging = config.judging
        # a stack holds rewrites only: where demonstrations are candidates too, each candidate is validated alone
        stacks = judging.validate_together and config.proposals.candidates == "instructions"
        stack_rounds = judging.stack_rounds if stacks else None
        return cls(tuple(config.abstraction.cluster_schedule), config.attribution.train_batch_size, stack_rounds)

    @property
    def cycle(self) -> int:
        """Rounds in one turn of the schedule: the longest a gradient waits, and the idle rounds that stall a run
        (:class:`~.idle_rounds.IdleRounds`)."""
        return len(self.cluster_schedule)

    def batch_size(self, n_train: int) -> int:
        """A round's batch: ``train_batch_size`` examples, never more than the training set holds."""
        return min(self.train_batch_size, n_train)

    def minimum(self, round_index: int) -> int:
        """The smallest cluster that makes a candidate in round ``round_index``: the schedule, cyclically (broad
        patterns, then finer ones, then again)."""
        return self.cluster_schedule[round_index % self.cycle]

    def still_waits(self, written_in: int, round_index: int) -> bool:
        """Whether a gradient written in round ``written_in`` may still join a cluster in round ``round_index``."""
        return round_index - written_in < self.cycle

    def closes_window(self, round_index: int) -> bool:
        """Whether round ``round_index`` validates its winners: the rounds are grouped in windows of ``stack_rounds``
        (0-1, 2-3, ... with 2), and a window's winners share the pass at its last round. A fixed window bounds the
        passes as a window opened by each first winner would, with less waiting on average. Every round closes its
        own window when winners are validated alone."""
        return self.stack_rounds is None or (round_index + 1) % self.stack_rounds == 0

    @staticmethod
    def no_failure_left(failures: float, batch_size: int, n_train: int) -> bool:
        """Whether a round's batch shows that no failure is left on the training set: it held the whole set."""
        return failures < 0.5 and batch_size == n_train


def judging_order(clusters: Sequence[Cluster], order: list[str]) -> list[Cluster]:
    """A round's clusters in the order they are judged: largest first, ties to the predictor that runs later (the
    reverse execution order of the intervention)."""
    reverse_rank = {name: -i for i, name in enumerate(order)}
    return sorted(clusters, key=lambda c: (-len(c.members), reverse_rank.get(c.predictor, 0)))
