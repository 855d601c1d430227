"""Gradients from reflecting on hard cases, for a round where no failure gave a pseudo-label.

Without them such a round teaches nothing, and a run whose failures are all hard cases stalls with budget left.
"""

from __future__ import annotations

import logging

import dspy

from ...runtime.jsonable import example_key
from ..abstraction import Abstraction
from ..attribution import Attribution
from ..state import Gradient, RunState

logger = logging.getLogger("dspy.agentgrad")


class ReflectionSource:
    """Asks the abstraction to reflect on the round's hard cases, each once per instruction of each predictor."""

    def __init__(self, abstraction: Abstraction, state: RunState):
        self.abstraction = abstraction
        self.state = state

    def gradients(self, batch: list[dspy.Example], attribution: Attribution) -> list[Gradient]:
        hard = attribution.report.hard_cases
        if not hard:
            return []
        program, order = self.state.instructions, attribution.report.order
        outcomes = {id(example): outcome for example, outcome in zip(batch, attribution.outcomes)}
        keys = {(id(e), n): (example_key(e), n, program.instruction(n)) for e in hard for n in order}
        asked = [(e, n) for e in hard for n in order if keys[id(e), n] not in self.state.reflected]
        if not asked:
            return []
        gradients = self.abstraction.reflections(
            [(n, e, outcomes[id(e)]) for e, n in asked], order, program, self.state.round_index
        )
        self.state.reflected.update(keys[id(e), n] for e, n in asked)
        logger.info(
            "round %d: no failure could be attributed; reflecting on %d hard case(s) gave %d gradient(s)",
            self.state.round_index,
            len({id(e) for e, _ in asked}),
            len(gradients),
        )
        return gradients
