"""Demonstration candidates: a predictor's pseudo-labels of the round shown to it (no LM call to make one)."""

from __future__ import annotations

from ...program.program_state import ProgramState
from ...roles.proposer import format_fields
from ..demonstrations import added_demos, pooled
from ..events import CandidateProposed, Dispatcher
from ..judging.verdicts import Verdicts
from ..state import CandidateRecord, Cluster, RunState
from .base import Afford


class DemoSource:
    """One candidate per predictor, from all of its clusters of the round (see :func:`pooled`)."""

    def __init__(self, state: RunState, verdicts: Verdicts, emit: Dispatcher, max_demos: int):
        self.state = state
        self.verdicts = verdicts
        self.emit = emit
        self.max_demos = max_demos

    def clusters(self, ready: list[Cluster]) -> list[Cluster]:
        return pooled(ready)

    def propose(
        self, cluster: Cluster, minimum: int, program: ProgramState, afford: Afford | None = None
    ) -> tuple[CandidateRecord, ProgramState | None]:
        """Free to make, so ``afford`` is asked only once there is a demonstration to judge."""
        name = cluster.predictor
        record = CandidateRecord(
            self.state.round_index, name, len(cluster.members), minimum, cluster.text, program.instruction(name), None
        )
        record.kind = "demos"
        self.verdicts.open(record)
        demos = added_demos(program.demos_of(name), [g.record for g in cluster.members], self.max_demos)
        if demos is None:
            self.verdicts.reject(record, "no new demonstration (each pseudo-label leaks or is shown already)")
            return record, None
        if afford is not None:
            afford()
        record.demos = demos
        shown = f"{len(demos)} demonstration(s): " + "; ".join(format_fields(d) for d in demos)
        self.emit(
            "on_candidate_proposed",
            CandidateProposed(self.state.round_index, name, len(cluster.members), cluster.text, shown),
        )
        return record, program.with_demos(name, demos)
