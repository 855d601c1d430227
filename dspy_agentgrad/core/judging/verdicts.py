"""The one writer of verdicts: whether a candidate is kept, and why, on its :class:`CandidateRecord`.

Checks, stacks and fallbacks all end in a verdict; written here only, a verdict reads the same wherever it was
reached, and a candidate the run stopped on is never left without one. Recording a judged candidate in the run's
state and announcing it to the callbacks is here too: a verdict given is never missing from the result.
"""

from __future__ import annotations

from ...runtime.budget import Budget
from ..events import CandidateJudged, Dispatcher, StopRun
from ..state import CandidateRecord, RoundRecord, RunState

#: The reason of a candidate the run stopped on after it was paid for and before its verdict.
STOPPED_BEFORE_JUDGED = "the run stopped before it was judged"


class Verdicts:
    """Writes every verdict, tracks the candidate being judged, and records judged candidates."""

    def __init__(self, state: RunState, budget: Budget, emit: Dispatcher):
        self.state = state
        self.budget = budget
        self.emit = emit
        self._open: CandidateRecord | None = None  # paid for, not recorded yet

    def open(self, record: CandidateRecord) -> None:
        """``record`` is paid for from here: it is recorded even if the run stops before its verdict."""
        self._open = record

    def close(self) -> None:
        """The open candidate is in someone's hands to record (judged or set aside)."""
        self._open = None

    def unfinished(self) -> list[CandidateRecord]:
        """The candidate the run stopped on (closed now), with a reason if it has no verdict; none when none."""
        record, self._open = self._open, None
        if record is None:
            return []
        if not record.accepted and not record.reason:
            record.reason = STOPPED_BEFORE_JUDGED
        return [record]

    @staticmethod
    def accept(record: CandidateRecord, reason: str) -> None:
        record.accepted, record.reason = True, reason

    @staticmethod
    def reject(record: CandidateRecord, reason: str) -> None:
        record.accepted, record.reason = False, reason

    @staticmethod
    def extend(record: CandidateRecord, note: str) -> None:
        """Add to the reason of ``record``'s verdict (how it was reached)."""
        record.reason += note

    @staticmethod
    def withdraw(record: CandidateRecord, reason: str) -> None:
        """Take back an acceptance and its validation (a stack it was validated in is judged again)."""
        record.accepted, record.val_score, record.validated_at = False, None, None
        record.reason = reason

    @classmethod
    def reopen(cls, record: CandidateRecord) -> None:
        """Clear every score and the verdict, for judging ``record`` again from its cluster check."""
        record.cluster_score_before = record.cluster_score_after = None
        cls.withdraw(record, record.reason)

    @staticmethod
    def accept_together(winners: list[CandidateRecord], last: CandidateRecord) -> None:
        """Every winner of a stack kept with the pass ``last`` (the top one) won for all of them."""
        for record in winners:
            record.accepted, record.val_score, record.validated_at = True, last.val_score, last.validated_at
            if len(winners) > 1:
                record.reason = f"{last.reason}, validated with {len(winners) - 1} other winner(s)"

    def record(self, round_record: RoundRecord, candidates: list[CandidateRecord]) -> None:
        """Keep judged candidates in the state and the round's counts, then report each (the log is an observer's).

        All are kept before any is reported, and a callback's :class:`StopRun` is raised once every one is reported.
        """
        for candidate in candidates:
            self.state.candidates.append(candidate)
            round_record.candidates += 1
            round_record.accepted += candidate.accepted
        stop: StopRun | None = None
        for candidate in candidates:
            judged = CandidateJudged(candidate, self.state.best_val_score, self.budget.metric_calls)
            try:
                self.emit("on_candidate_accepted" if candidate.accepted else "on_candidate_rejected", judged)
            except StopRun as raised:
                stop = stop or raised
        if stop is not None:
            raise stop
