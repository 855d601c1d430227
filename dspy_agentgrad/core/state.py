"""The run's state: what a run has decided so far, in one object the engine owns.

The engine changes it; the result builder (:meth:`AgentGradResult.from_run`) and the ``state.json``
snapshot read it, so neither needs the engine. Also the records it is made of: attributions
(steps 1-2), gradients and clusters (steps 3-4), candidates and rounds (step 5).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import dspy

from ..program.objectives import objective_means
from ..program.program_state import ProgramState
from ..runtime.jsonable import to_jsonable

if TYPE_CHECKING:
    from ..program.runs import Outcome


LABEL_CHARS = 160  # an example's label in reports
BLAME_TEXT_CHARS = 2000  # longest text kept per field of a blame record


def example_label(example: dspy.Example) -> str:
    """A short, readable label of an example: its inputs, ``name=value``, clipped."""
    text = "; ".join(f"{k}={' '.join(str(v).split())}" for k, v in example.inputs().items())
    return text if len(text) <= LABEL_CHARS else text[: LABEL_CHARS - 1] + "\u2026"


def _clipped(values: dict[str, Any]) -> dict[str, Any]:
    """JSON-ready values with long texts (retrieved passages, say) cut, so result.json stays readable."""
    out = to_jsonable(values)
    return {
        k: v[:BLAME_TEXT_CHARS] + "\u2026" if isinstance(v, str) and len(v) > BLAME_TEXT_CHARS else v
        for k, v in out.items()
    }


def exact_sum(scores: Iterable[float]) -> Fraction:
    """The sum of ``scores`` in exact arithmetic: no rounding, so no order or chunking changes a comparison."""
    return sum((Fraction(s) for s in scores), Fraction(0))


def exact_total(outcomes: list[Outcome]) -> Fraction:
    """The exact sum of the outcomes' scores (:func:`exact_sum`)."""
    return exact_sum(o.score for o in outcomes)


@dataclass
class AttributionRecord:
    """A failure fixed by hinting one predictor: the agent-level pseudo-label."""

    example: dspy.Example
    inputs: dict[str, Any]
    original: dict[str, Any]
    corrected: dict[str, Any]
    feedback: str = ""
    program_outputs: dict[str, Any] = field(default_factory=dict)
    leaked: bool = False  # the fix copied a value its hint revealed and the inputs lack: never a demonstration

    def to_dict(self) -> dict:
        """A JSON-ready form (the example as a dict), for events and reports."""
        return {
            "example": to_jsonable(self.example.toDict()),
            "inputs": self.inputs,
            "original": self.original,
            "corrected": self.corrected,
            "feedback": self.feedback,
            "leaked": self.leaked,
        }


@dataclass
class BlameRecord:
    """One training failure and where its round put it: on the predictor whose hinted re-run fixed it,
    with that predictor's output before and with the hint, or on nobody (``predictor`` None: a hard case)."""

    round: int
    predictor: str | None
    example: dict[str, Any]  # the example's inputs
    original: dict[str, Any] = field(default_factory=dict)
    corrected: dict[str, Any] = field(default_factory=dict)
    feedback: str = ""


@dataclass
class AttributionReport:
    """Steps 1-2 of AgentGrad: which predictor is at fault for each failure."""

    order: list[str]
    attributed: dict[str, list[AttributionRecord]]
    hard_cases: list[dspy.Example]
    passed: list[dspy.Example]
    leaked: int = 0
    explained_single: int = 0
    explained_cumulative: int = 0
    replay_misses: int = 0
    placebo_withheld: int = 0  # hints of cumulative fixes that a placebo replaced as well: no pseudo-label
    cumulative_deferred: int = 0  # hard cases left for their example's next batch (cumulative_hints="revisits")

    def counts(self) -> dict[str, int]:
        """Failures attributed to each predictor: what the round's log line and events show."""
        return {name: len(records) for name, records in self.attributed.items()}

    def blame(self, round_index: int) -> list[BlameRecord]:
        """Every failure of the round and where it went, for ``result.json`` and the report."""
        records = [
            BlameRecord(
                round_index,
                name,
                _clipped(r.example.inputs().toDict()),
                _clipped(r.original),
                _clipped(r.corrected),
                r.feedback,
            )
            for name, attributed in self.attributed.items()
            for r in attributed
        ]
        return records + [BlameRecord(round_index, None, _clipped(e.inputs().toDict())) for e in self.hard_cases]

    def to_dict(self) -> dict:
        """A JSON-ready form, for ``AgentGrad.attribute`` users and reports."""
        return {
            "order": self.order,
            "attributed": {k: [r.to_dict() for r in v] for k, v in self.attributed.items()},
            "hard_cases": [to_jsonable(e.toDict()) for e in self.hard_cases],
            "passed": len(self.passed),
            "rejected_as_label_leak": self.leaked,
            "explained_single": self.explained_single,
            "explained_cumulative": self.explained_cumulative,
            "replay_misses": self.replay_misses,
            "withheld_by_placebo": self.placebo_withheld,
            "cumulative_deferred": self.cumulative_deferred,
        }


@dataclass
class CandidateRecord:
    """One candidate (a rewrite, or demonstrations) and how it was judged (step 5): kept in the result so a reader
    can see why it won or lost."""

    round: int
    predictor: str
    cluster_size: int
    min_cluster_size: int
    gradient: str
    previous_instruction: str
    instruction: str | None
    cluster_score_before: float | None = None
    cluster_score_after: float | None = None
    val_score: float | None = None
    accepted: bool = False
    reason: str = ""
    metric_calls: int = 0
    validated_at: int | None = None  # metric calls when its validation pass ended (shared by a stack's winners)
    kind: str = "instructions"  # "instructions": a rewrite; "demos": demonstrations from pseudo-labels
    demos: list[dict] | None = None  # the predictor's added demonstrations under this candidate
    objectives: dict[str, float] = field(default_factory=dict)  # validation mean per objective, when validated


@dataclass
class RoundRecord:
    """One round's counts (failures, blame, gradients, clusters, decisions), for the result and the report."""

    round: int
    min_cluster_size: int
    batch_size: int
    failures: int
    attributed: dict[str, int]
    hard_cases: int
    label_leaks: int
    gradients: int
    clusters: int
    waiting: int
    candidates: int = 0
    accepted: int = 0
    best_val_score: float | None = None
    metric_calls: int = 0
    explained_single: int = 0
    explained_cumulative: int = 0
    placebo_withheld: int = 0
    reflected: int = 0  # gradients from reflections on hard cases (``reflect_hard_cases``)
    cumulative_deferred: int = 0  # hard cases whose cumulative hints wait for their example's next batch
    stacked: list[str] = field(default_factory=list)  # winners' predictors left unvalidated for the next round's


@dataclass
class Gradient:
    """A sample-level textual gradient for one predictor, from one attributed failure, written against
    ``instruction`` (the predictor's instruction then)."""

    predictor: str
    record: AttributionRecord
    text: str
    round: int
    instruction: str


@dataclass
class Cluster:
    """Gradients of one predictor that ask for one correction, with the generalized gradient."""

    predictor: str
    members: list[Gradient]
    text: str


@dataclass
class RunState:
    """What the run has decided so far: the program, the best validation scores, every record.

    One object, owned and changed by the engine, read by the result builder and the snapshot
    writer: so reporting a run needs no engine, and the state a round leaves is in one place.
    """

    instructions: ProgramState  # the current program: instructions and added demonstrations
    round_index: int = 0
    best_val_score: float | None = None
    best_val_scores: list[float] = field(default_factory=list)  # per validation example, of the best program
    initial_val_scores: list[float] = field(default_factory=list)  # per validation example, of the starting program
    val_labels: list[str] = field(default_factory=list)  # each validation example's label (example_label)
    blame: list[BlameRecord] = field(default_factory=list)  # every failure of every round and where it went
    best_val_total: Fraction = Fraction(0)  # exact, for acceptance decisions
    best_val_objectives: dict[str, float] = field(default_factory=dict)  # validation mean per objective, best program
    initial_val_objectives: dict[str, float] = field(default_factory=dict)  # the same, of the starting program
    initial_val_score: float | None = None
    rounds: list[RoundRecord] = field(default_factory=list)
    candidates: list[CandidateRecord] = field(default_factory=list)
    val_history: list[tuple[int, float]] = field(default_factory=list)
    waiting: list[Gradient] = field(default_factory=list)  # gradients carried to a later round
    reflected: set[tuple[str, str, str]] = field(default_factory=set)  # (example, predictor, instruction) reflected on
    stop_reason: str = "not started"
    interrupted: bool = False

    def __post_init__(self) -> None:
        self.instructions = ProgramState.of(self.instructions)

    def set_best(self, outcomes: list[Outcome]) -> None:
        """Make these validation outcomes the bar a candidate must clear."""
        self.set_best_scores([o.score for o in outcomes])
        self.best_val_objectives = objective_means(o.objectives for o in outcomes)

    def set_best_scores(self, scores: list[float]) -> None:
        """Make these validation scores (one per example) the bar a candidate must clear."""
        self.best_val_scores = list(scores)
        self.best_val_total = exact_sum(scores)
        self.best_val_score = float(self.best_val_total / len(scores)) if scores else 0.0

    def rejected_rewrites(self, predictor: str) -> list[str]:
        """Rewrites of ``predictor`` judged and rejected so far (the rewrite role is shown the last few)."""
        return [c.instruction for c in self.candidates if c.predictor == predictor and not c.accepted and c.instruction]
