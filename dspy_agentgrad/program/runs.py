"""What one program run leaves behind: its predictor calls (:class:`Step`), its scored result
(:class:`Outcome`, the unit the journal stores), an earlier run it may reuse (:class:`Reference`), and a run
not scored yet (:class:`Execution`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from ..runtime.jsonable import digest
from ..runtime.usage import empty_usage


@dataclass
class Step:
    """One predictor call: which predictor, its call number in the run, its inputs and outputs.

    ``prediction`` is a copy of the object the call returned, taken when it returned, kept in memory
    only (never journaled) so that replay hands back the same types and values.
    """

    name: str
    inputs: dict[str, Any]
    outputs: dict[str, Any]
    call: int = 0
    prediction: Any = field(default=None, repr=False, compare=False)
    setting: str = ""  # a digest of the call's own demos, config and LM, when it passed any
    error: str = ""  # the call raised (a parse failure, an LM error): its kind and message; it has no outputs

    def to_dict(self) -> dict:
        """The journaled form (the live prediction stays in memory)."""
        data = {"name": self.name, "call": self.call, "inputs": self.inputs, "outputs": self.outputs}
        if self.setting:
            data["setting"] = self.setting
        if self.error:
            data["error"] = self.error
        return data

    @classmethod
    def from_dict(cls, data: dict) -> Step:
        """Read back :meth:`to_dict` (a journal line after a resume)."""
        return cls(
            data["name"],
            data["inputs"],
            data["outputs"],
            data.get("call", 0),
            setting=data.get("setting", ""),
            error=data.get("error", ""),
        )

    def shown_outputs(self) -> dict[str, Any]:
        """The outputs, or for a call that raised, its error: what the call gave, as the prompt LM is shown it."""
        return {"error": self.error} if self.error else self.outputs


@dataclass
class Outcome:
    """The result of one scored program run (one metric call)."""

    score: float
    feedback: str = ""
    error: str | None = None
    steps: list[Step] = field(default_factory=list)
    outputs: dict[str, Any] = field(default_factory=dict)
    usage: dict[str, int] = field(default_factory=empty_usage)
    attempts: int = 1
    replay_misses: int = 0
    scored: bool = True  # False: the program output equals its reference run's, whose score it took
    objectives: dict[str, float] = field(default_factory=dict)  # the metric's objective_scores for this run
    rerun: int | None = None  # its calls its reference could not supply (made anew); None: no reference, all

    @property
    def task_share(self) -> Fraction:
        """The share of its predictor calls this run made anew (k of N: k/N), what the budget counts as its task-LM
        spend in metric calls: a run with nothing to reuse counts one, as a run of ``dspy.GEPA`` spends; a run that
        re-ran k of its N calls, scored or not, spent about k/N of that."""
        if not self.steps:
            return Fraction(0)
        made = len(self.steps) if self.rerun is None else min(self.rerun, len(self.steps))
        return Fraction(made, len(self.steps))

    def order(self) -> list[str]:
        """Predictor names in order of first call in this run."""
        seen: list[str] = []
        for step in self.steps:
            if step.name not in seen:
                seen.append(step.name)
        return seen

    def calls(self, name: str) -> list[Step]:
        """Every call of predictor ``name`` in this run, in call order."""
        return sorted((s for s in self.steps if s.name == name), key=lambda s: s.call)

    def first_step(self, name: str) -> Step | None:
        """The first call of predictor ``name`` (None when it did not run): what an ablation attributes."""
        calls = self.calls(name)
        return calls[0] if calls else None

    def to_dict(self) -> dict:
        """The journaled form: a paid run is replayed from it after a resume."""
        data = {
            "score": self.score,
            "feedback": self.feedback,
            "error": self.error,
            "steps": [s.to_dict() for s in self.steps],
            "outputs": self.outputs,
            "usage": self.usage,
            "attempts": self.attempts,
            "replay_misses": self.replay_misses,
        }
        if not self.scored:
            data["scored"] = False
        if self.rerun is not None:
            data["rerun"] = self.rerun
        if self.objectives:  # only when the metric reports any: older journals read back unchanged
            data["objectives"] = self.objectives
        return data

    @classmethod
    def from_dict(cls, data: dict) -> Outcome:
        """Read back :meth:`to_dict`; fields added later default, so old journals still load."""
        return cls(
            score=data["score"],
            feedback=data.get("feedback", ""),
            error=data.get("error"),
            steps=[Step.from_dict(s) for s in data.get("steps", [])],
            outputs=data.get("outputs", {}),
            usage=data.get("usage", empty_usage()),
            attempts=data.get("attempts", 1),
            replay_misses=data.get("replay_misses", 0),
            scored=data.get("scored", True),
            objectives=data.get("objectives", {}),
            rerun=data.get("rerun"),
        )


@dataclass
class Reference:
    """An earlier run of the same example, and the predictors whose instruction or hint differs from it."""

    outcome: Outcome
    changed: frozenset[str]

    def reusable_steps(self, replayed: Iterable[Step] = ()) -> list[Step]:
        """The calls of unchanged predictors, except those already in the run's strict replay."""
        taken = {id(step) for step in replayed}
        return [s for s in self.outcome.steps if s.name not in self.changed and id(s) not in taken]

    def rerun_calls(self, steps: Iterable[Step]) -> int:
        """How many of a run's ``steps`` this reference could not supply: calls of a changed predictor, and calls
        of the others whose inputs or setting it does not hold. It counts from the steps alone, not from how the
        run was made (live, ahead by speculation, or after a resume), so the count is the same either way."""
        held = Counter(_call_identity(s) for s in self.outcome.steps if s.name not in self.changed and not s.error)
        rerun = 0
        for step in steps:
            identity = _call_identity(step)
            if step.name in self.changed or held[identity] == 0:
                rerun += 1
            else:
                held[identity] -= 1
        return rerun


def _call_identity(step: Step) -> tuple[str, str, str]:
    """What tells one predictor call from another for reuse (as :func:`.run_control.call_key`): its predictor,
    inputs and call setting."""
    return step.name, digest(step.inputs), step.setting


@dataclass
class Execution:
    """A program run before scoring: what it returned (or raised), its calls and LM usage."""

    prediction: Any
    error: BaseException | None
    steps: list[Step]
    usage: dict[str, int]
    attempts: int
    replay_misses: int
    predictor_errors: list[BaseException] = field(default_factory=list, repr=False)

    def as_reference(self, changed: frozenset[str]) -> Reference | None:
        """This run as the reference of a later run of the same example (its calls reused, not its score)."""
        if self.error is not None:
            return None
        return Reference(Outcome(0.0, steps=self.steps), changed)
