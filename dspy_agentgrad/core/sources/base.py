"""What a kind of candidate is to the judges: a source that proposes one candidate per cluster it is given.

A proposal is a value the judge decides on (the record, and the program it would make); the source never judges.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from ...program.program_state import ProgramState
from ..state import CandidateRecord, Cluster

#: Raises :class:`BudgetExhausted` when the check of the candidate about to be made could not be paid for.
Afford = Callable[[], None]


class CandidateSource(Protocol):
    """One kind of candidate (instruction rewrites, demonstrations)."""

    def clusters(self, ready: list[Cluster]) -> list[Cluster]:
        """The clusters this source proposes for, in the order they are judged."""

    def propose(
        self, cluster: Cluster, minimum: int, program: ProgramState, afford: Afford | None = None
    ) -> tuple[CandidateRecord, ProgramState | None]:
        """The record of ``cluster``'s candidate on ``program`` (opened with the verdict writer as soon as it is
        paid for), and the candidate program; None when there is nothing to judge (the record says why).
        ``afford`` is asked before anything is paid for."""
