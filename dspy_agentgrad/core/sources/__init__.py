"""Where a round's candidates come from: each kind is a source, and ``candidates`` picks a composition of them.

``"instructions"`` is the paper (rewrites, with reflections on hard cases), ``"demos"`` demonstrations alone and
``"both"`` demonstrations, then rewrites on top; the judges take whatever sources they are given.
"""

from __future__ import annotations

from dataclasses import dataclass

import dspy

from ...config import AgentGradConfig
from ..abstraction import Abstraction
from ..attribution import Attribution
from ..events import Dispatcher
from ..judging.verdicts import Verdicts
from ..rewriting import Rewriter
from ..state import Gradient, RunState
from .base import CandidateSource
from .demos import DemoSource
from .reflections import ReflectionSource
from .rewrites import RewriteSource


@dataclass
class Sources:
    """The run's sources: ``candidates`` in the order a round judges them; ``rewrites`` and ``reflections`` are
    None when switched off."""

    candidates: list[CandidateSource]
    rewrites: RewriteSource | None
    reflections: ReflectionSource | None

    def reflect(self, batch: list[dspy.Example], attribution: Attribution) -> list[Gradient]:
        """Gradients from the round's hard cases (asked only when its failures gave none)."""
        return self.reflections.gradients(batch, attribution) if self.reflections else []


def sources_for(
    config: AgentGradConfig,
    rewriter: Rewriter,
    abstraction: Abstraction,
    state: RunState,
    verdicts: Verdicts,
    emit: Dispatcher,
) -> Sources:
    """The composition ``config.proposals.candidates`` names (reflections feed rewrites, so they go with them)."""
    kinds = config.proposals.candidates
    demos = DemoSource(state, verdicts, emit, config.proposals.max_demos) if kinds != "instructions" else None
    rewrites = RewriteSource(rewriter, state, verdicts, emit) if kinds != "demos" else None
    reflections = ReflectionSource(abstraction, state) if rewrites and config.proposals.reflect_hard_cases else None
    return Sources([s for s in (demos, rewrites) if s is not None], rewrites, reflections)
