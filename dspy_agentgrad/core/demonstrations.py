"""Demonstration candidates: a cluster's pseudo-labels shown to its predictor as worked examples.

Every attributed failure carries what no dataset has: the inputs one step got and the output a
hint got from it. A rewrite turns that into advice; a demonstration shows it. Small models
follow demonstrations far more readily than instructions (benchmarks/local_lm/demo_job.md), and a
demonstration needs no prompt LM to write.

A pseudo-label whose hinted fix copied a value the hint revealed and the step's inputs do not
hold (a leak, see :func:`dspy_agentgrad.program.hints.leaks_label`) never becomes a demonstration: it
would teach the step to answer with something it cannot see.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..program.program_state import Demo
from .state import AttributionRecord


def demo_of(record: AttributionRecord) -> Demo | None:
    """The demonstration a pseudo-label makes: the step's inputs and its corrected outputs; None for a leak
    or a record without a corrected output."""
    if record.leaked or not record.corrected:
        return None
    return {**record.inputs, **record.corrected}


def added_demos(current: list[Demo], records: Iterable[AttributionRecord], max_demos: int) -> list[Demo] | None:
    """The predictor's added demonstrations with the cluster's joined on: ``current`` and then each new one
    whose inputs no kept demonstration has, the last ``max_demos`` of them; None when the cluster adds none."""
    kept = [dict(d) for d in current]
    fresh = 0
    for record in records:
        demo = demo_of(record)
        if demo is None or any(_same_inputs(demo, other, record.inputs) for other in kept):
            continue
        kept.append(demo)
        fresh += 1
    return kept[-max_demos:] if fresh else None


def _same_inputs(demo: Demo, other: Demo, inputs: dict) -> bool:
    return all(other.get(name) == demo[name] for name in inputs)
