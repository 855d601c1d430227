"""Instruction rewrites (the paper's candidates): the rewrite role's new instruction for a cluster."""

from __future__ import annotations

from ...program.program_state import ProgramState
from ..events import CandidateProposed, Dispatcher
from ..judging.verdicts import Verdicts
from ..rewriting import Rewriter
from ..state import CandidateRecord, Cluster, RunState
from .base import Afford


class RewriteSource:
    """One rewrite per cluster, made on the program it would be installed on."""

    def __init__(self, rewriter: Rewriter, state: RunState, verdicts: Verdicts, emit: Dispatcher):
        self.rewriter = rewriter
        self.state = state
        self.verdicts = verdicts
        self.emit = emit

    def clusters(self, ready: list[Cluster]) -> list[Cluster]:
        return ready

    def propose(
        self, cluster: Cluster, minimum: int, program: ProgramState, afford: Afford | None = None
    ) -> tuple[CandidateRecord, ProgramState | None]:
        """A rewrite that is missing, unchanged or too long is recorded and not judged (see :class:`Rewriter`)."""
        if afford is not None:
            afford()  # before paying for the rewrite
        name, current = cluster.predictor, program.instruction(cluster.predictor)
        record = CandidateRecord(
            self.state.round_index, name, len(cluster.members), minimum, cluster.text, current, None
        )
        self.verdicts.open(record)
        proposal = self.rewriter.rewrite(cluster, program)
        problem = self.rewriter.unusable(proposal, current, name)
        if proposal is not None and proposal.strip() != current.strip():
            record.instruction = proposal
        if problem is not None:
            self.verdicts.reject(record, problem)
            return record, None
        self.emit(
            "on_candidate_proposed",
            CandidateProposed(self.state.round_index, name, len(cluster.members), cluster.text, proposal),
        )
        return record, program.with_instruction(name, proposal)
