"""The paper's judge: one candidate at a time, on the current program; its cluster first, then validation."""

from __future__ import annotations

from ...program.program_state import ProgramState
from ..sources.base import CandidateSource
from ..state import CandidateRecord, Cluster, RoundRecord
from .protocol import JudgingParts
from .pruning import RewritePruning


class SequentialJudge:
    """Judges each source's candidates in turn, each verdict reported before the next candidate is made (a callback
    may stop the run)."""

    def __init__(self, parts: JudgingParts, sources: list[CandidateSource]):
        self.parts = parts
        self.sources = sources
        self.pruning = RewritePruning(parts, self.install) if parts.prune_rewrites else None

    def validates_this_round(self) -> bool:
        return True

    def judge_round(
        self, ready: list[Cluster], minimum: int, round_record: RoundRecord, judged: list[CandidateRecord]
    ) -> None:
        parts = self.parts
        for source in self.sources:
            for cluster in source.clusters(ready):
                parts.before_judging()
                before = list(parts.state.best_val_scores)
                candidate = self.update(source, cluster, minimum)
                parts.verdicts.close()
                parts.verdicts.record(round_record, [candidate])
                pruned: list[CandidateRecord] = []
                try:
                    self.prune([candidate], before, pruned)
                finally:
                    parts.verdicts.record(round_record, pruned)

    def waiting(self) -> list[CandidateRecord]:
        return []

    def settle(self, validate: bool, stopped: bool = False) -> None:
        """Nothing waits: every verdict was given in its round."""

    def update(self, source: CandidateSource, cluster: Cluster, minimum: int) -> CandidateRecord:
        """Step 5 for one cluster: ``source``'s candidate, then two-stage acceptance with exact early rejection.

        The candidate must beat the current program on its cluster, then on validation (``val_acceptance``:
        strictly, at least equal, or strictly without its best example); see :class:`Acceptance`. Nothing is paid
        for a candidate whose check the budget could not finish. An accepted candidate becomes the current program.
        """
        parts = self.parts
        parts.before_judging()
        record, candidate = source.propose(
            cluster, minimum, parts.state.instructions, lambda: parts.acceptance.require_affordable(cluster)
        )
        if candidate is not None:
            self.judge(record, candidate, cluster)
        return record

    def judge(self, record: CandidateRecord, candidate: ProgramState, cluster: Cluster) -> None:
        """Two-stage acceptance of one candidate on its cluster's examples; the current program becomes it when it
        wins."""
        budget = self.parts.budget
        start = budget.metric_calls
        self.parts.acceptance.judge(record, candidate, [g.record.example for g in cluster.members])
        record.metric_calls = budget.metric_calls - start
        if record.accepted:
            self.install(candidate)

    def prune(self, winners: list[CandidateRecord], before: list[float], judged: list[CandidateRecord]) -> None:
        """With ``prune_rewrites``: leave out what ``winners`` added that validation does better without (see
        :class:`RewritePruning`; ``before``: the validation scores of the program they were kept over); the removals
        judged go into ``judged``."""
        if self.pruning is not None:
            self.pruning.prune(winners, before, judged)

    def install(self, candidate: ProgramState, replacing: bool = False) -> None:
        """An accepted candidate becomes the current program. ``replacing``: it takes the place of the program
        installed last (a stack without a winner that left it), so the validation history keeps one entry for both."""
        state = self.parts.state
        state.instructions = candidate
        entry = (self.parts.budget.metric_calls, state.best_val_score)
        if replacing:
            state.val_history[-1] = entry
        else:
            state.val_history.append(entry)
