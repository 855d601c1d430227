"""What the engine asks of a round's judge, and the parts every judge works with.

The engine hands a round's clusters to its judge and never asks how they are judged: the paper's judge takes one
candidate at a time, the stacked judge validates a stack of winners together. Either is picked once, from the
options, by :func:`dspy_agentgrad.core.judging.judge_for`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import dspy

from ...program.evaluation import Evaluator
from ...runtime.budget import Budget
from ..state import CandidateRecord, Cluster, RoundRecord, RunState
from .acceptance import Acceptance
from .verdicts import Verdicts


@dataclass
class JudgingParts:
    """What judging reads and changes: the checks, the one verdict writer and the run's state.
    ``before_judging`` waits for the starting program's validation pass (the first check needs its scores);
    ``prune_rewrites``: sentences kept winners added are left out where validation does better without them."""

    acceptance: Acceptance
    verdicts: Verdicts
    evaluator: Evaluator
    budget: Budget
    valset: list[dspy.Example]
    state: RunState
    before_judging: Callable[[], None]
    prune_rewrites: bool = False


class RoundJudge(Protocol):
    """Step 5 for a round's clusters: proposes through the sources, judges, installs the winners."""

    def validates_this_round(self) -> bool:
        """Whether this round's winners get their validation pass in this round (not a later round's): what the
        speculation layer needs to run the round's checks ahead."""

    def judge_round(
        self, ready: list[Cluster], minimum: int, round_record: RoundRecord, judged: list[CandidateRecord]
    ) -> None:
        """Judge the round's candidates. Candidates with a verdict go into ``judged`` when the judge reports them
        together (also when the run stops half-way); one reported at once goes into ``round_record`` directly."""

    def waiting(self) -> list[CandidateRecord]:
        """Winners installed but not validated yet (they wait for a later round's validation pass)."""

    def settle(self, validate: bool, stopped: bool = False) -> None:
        """On the way out: give winners still waiting their validation pass when ``validate`` and the budget allow
        (otherwise the program goes back to the last validated one), and record them; ``stopped``: a cap or a
        callback ended the run, so their verdicts come from a window it cut short."""
