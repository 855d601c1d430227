"""The program AgentGrad is optimizing, as a value: each predictor's instruction and the demonstrations it adds.

Evaluation keys, replay references and the journal all name a program by this value. A program without added
demonstrations has the same :meth:`ProgramState.key` as the mapping predictor -> instruction it was before
demonstrations existed, so journals written before then still replay. Where a program comes from outside (a plain
mapping of instructions), :meth:`ProgramState.of` makes it one.

A demonstration is a dict of a predictor's input and output field values (JSON values), made
from a pseudo-label: the inputs the predictor got and the output a hint got from it. It is added
to the predictor's own ``demos`` (those of the user's program stay first).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import dspy

from ..runtime.jsonable import digest

Demo = dict[str, Any]


class ProgramState:
    """Instructions per predictor (:meth:`instruction`, ``instructions``) and the demonstrations added per predictor
    (``demos``).

    Immutable: :meth:`with_instruction` and :meth:`with_demos` return new states.
    """

    __slots__ = ("_instructions", "_demos", "_key")

    def __init__(self, instructions: Mapping[str, str], demos: Mapping[str, list[Demo]] | None = None):
        self._instructions = dict(instructions)
        unknown = sorted(set(demos or {}) - set(self._instructions))
        if unknown:
            raise ValueError(f"demos for unknown predictors {unknown}; the program's are {list(self._instructions)}")
        self._demos = {name: [dict(d) for d in ds] for name, ds in (demos or {}).items() if ds}
        self._key: str | None = None

    @classmethod
    def of(cls, value: ProgramState | Mapping[str, str]) -> ProgramState:
        """``value`` as a state: itself, or a plain mapping of instructions with no demonstrations."""
        return value if isinstance(value, ProgramState) else cls(value)

    def instruction(self, name: str) -> str:
        """Predictor ``name``'s instruction."""
        return self._instructions[name]

    @property
    def names(self) -> list[str]:
        """The predictors, in the program's order."""
        return list(self._instructions)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ProgramState):
            return self._instructions == other._instructions and self._demos == other._demos
        return NotImplemented

    def __repr__(self) -> str:
        added = {name: len(ds) for name, ds in self._demos.items()}
        return f"ProgramState({self._instructions!r}, demos added: {added or 'none'})"

    @property
    def instructions(self) -> dict[str, str]:
        return dict(self._instructions)

    @property
    def demos(self) -> dict[str, list[Demo]]:
        """The demonstrations added per predictor (predictors with none are absent)."""
        return {name: [dict(d) for d in ds] for name, ds in self._demos.items()}

    def demos_of(self, name: str) -> list[Demo]:
        return [dict(d) for d in self._demos.get(name, [])]

    def key(self) -> str:
        """A digest naming this program; without demonstrations, the digest of the instructions alone."""
        if self._key is None:
            self._key = digest(
                self._instructions if not self._demos else {"instructions": self._instructions, "demos": self._demos}
            )
        return self._key

    def changed(self, other: ProgramState) -> frozenset[str]:
        """The predictors whose instruction or demonstrations differ between the two programs."""
        names = set(self._instructions) | set(other._instructions)
        return frozenset(
            n
            for n in names
            if self._instructions.get(n) != other._instructions.get(n) or self._demos.get(n) != other._demos.get(n)
        )

    def with_instruction(self, name: str, text: str) -> ProgramState:
        return ProgramState({**self._instructions, name: text}, self._demos)

    def with_demos(self, name: str, demos: list[Demo]) -> ProgramState:
        return ProgramState(self._instructions, {**self._demos, name: demos})

    def to_dict(self) -> dict:
        return {"instructions": dict(self._instructions), "demos": self.demos}


def as_examples(demos: list[Demo]) -> list[dspy.Example]:
    """Demonstrations as DSPy puts them on a predictor (``predictor.demos``)."""
    return [dspy.Example(**demo) for demo in demos]


def apply_state(program: dspy.Module, state: ProgramState) -> dspy.Module:
    """A copy of ``program`` with the state's instructions, and its demonstrations after each predictor's own."""
    copy = program.deepcopy()
    for name, predictor in copy.named_predictors():
        predictor.signature = predictor.signature.with_instructions(state.instruction(name))
        added = state.demos_of(name)
        if added:
            predictor.demos = list(predictor.demos) + as_examples(added)
    return copy
