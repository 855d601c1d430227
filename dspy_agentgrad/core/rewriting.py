"""Step 5's proposal: what the rewrite role is shown for a cluster, and whether its answer can be judged."""

from __future__ import annotations

from ..config import AgentGradConfig
from ..program.program_state import ProgramState
from ..roles.instruction_proposer import RewriteRequest
from ..roles.proposer import Proposer
from .state import Cluster, RunState

#: Cases of the cluster (original vs corrected output) and rejected rewrites the rewrite role sees.
REWRITE_EXAMPLES = 3
REJECTED_SHOWN = 5
#: Room a rewrite of an instruction that starts over ``max_instruction_chars`` gets beyond its starting length,
#: as a share of the cap (a ReAct agent's instruction lists its tools and their argument schemas).
OVER_CAP_ROOM = 0.25


class Rewriter:
    """Asks the rewrite role for a cluster's new instruction; the engine and speculation ask the same way,
    so a rewrite fetched ahead is the memoized answer to the request the engine sends later."""

    def __init__(self, config: AgentGradConfig, proposer: Proposer, signatures: dict[str, str], state: RunState):
        self.config = config
        self.proposer = proposer
        self.signatures = signatures
        self.state = state
        self.starting_chars = {name: len(text) for name, text in state.instructions.instructions.items()}

    def max_chars(self, predictor: str | None) -> int:
        """The longest rewrite of ``predictor``: ``max_instruction_chars``, or for an instruction that was already
        longer when the run started, its starting length plus ``OVER_CAP_ROOM`` of the cap (else no rewrite
        could ever be judged)."""
        cap, start = self.config.proposals.max_instruction_chars, self.starting_chars.get(predictor or "", 0)
        return cap if start <= cap else start + int(cap * OVER_CAP_ROOM)

    def request(self, cluster: Cluster, program: ProgramState | None = None) -> RewriteRequest:
        """What the rewrite role sees for ``cluster``: feedback, a few cases, this step's rejected rewrites.
        ``program``: the instructions to rewrite from (the current ones by default)."""
        name = cluster.predictor
        shown = [
            (g.record.inputs, g.record.original, g.record.corrected)
            for g in cluster.members[:REWRITE_EXAMPLES]
            if g.record.corrected
        ]
        return RewriteRequest(
            predictor=name,
            step_signature=self.signatures[name],
            current_instruction=(program or self.state.instructions).instruction(name),
            generalized_gradient=cluster.text,
            gradients=[g.text for g in cluster.members],
            examples=shown,
            rejected=self.state.rejected_rewrites(name)[-REJECTED_SHOWN:],
            max_chars=self.max_chars(name),
        )

    def rewrite(self, cluster: Cluster, program: ProgramState | None = None) -> str | None:
        """The rewrite role's new instruction for ``cluster`` (None when it failed)."""
        return self.proposer.rewrite(self.request(cluster, program))

    def unusable(self, proposal: str | None, current: str, predictor: str | None = None) -> str | None:
        """Why ``proposal`` (a rewrite of ``predictor``) cannot be judged against ``current`` (the candidate's
        reason), or None."""
        if proposal is None:
            return "rewrite failed"
        if proposal.strip() == current.strip():
            return "rewrite unchanged"
        cap, start = self.max_chars(predictor), self.starting_chars.get(predictor or "", 0)
        if len(proposal) <= cap:
            return None
        if cap == self.config.proposals.max_instruction_chars:
            return f"rewrite longer than max_instruction_chars={cap} ({len(proposal)} characters)"
        return (
            f"rewrite longer than {cap} characters ({len(proposal)}): the starting instruction was already over "
            f"max_instruction_chars={self.config.proposals.max_instruction_chars} ({start} characters), so its "
            f"rewrites may have up to {cap}"
        )
