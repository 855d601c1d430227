"""Demonstration candidates: a cluster's pseudo-labels shown to its predictor as worked examples.

Every attributed failure carries what no dataset has: the inputs one step got and the output a
hint got from it. A rewrite turns that into advice; a demonstration shows it. Small models
follow demonstrations far more readily than instructions (experiments/main_job/demo_job.md), and a
demonstration needs no prompt LM to write.

A pseudo-label whose hinted fix copied a value the hint revealed and the step's inputs do not
hold (a leak, see :func:`dspy_agentgrad.program.hints.leaks_label`) never becomes a demonstration: it
would teach the step to answer with something it cannot see.

A predictor's demonstrations come from all of its clusters of the round, one per cluster in turn
(:func:`pooled`): a cluster holds alike pseudo-labels, and a small model shown alike cases copies
their answer into other questions (experiments/main_job/demo_job.md, section 7).
"""

from __future__ import annotations

from collections.abc import Iterable

from ..program.program_state import Demo
from .state import AttributionRecord, Cluster


def demo_of(record: AttributionRecord) -> Demo | None:
    """The demonstration a pseudo-label makes: the step's inputs and its corrected outputs; None for a leak
    or a record without a corrected output."""
    if record.leaked or not record.corrected:
        return None
    return {**record.inputs, **record.corrected}


def added_demos(current: list[Demo], records: Iterable[AttributionRecord], max_demos: int) -> list[Demo] | None:
    """The predictor's added demonstrations with new ones joined on: ``current`` and then the first ``max_demos``
    new ones (in ``records`` order) whose inputs no kept demonstration has and whose outputs none shows already
    (a repeated answer is copied), the last ``max_demos`` of them; None when no record adds one."""
    kept = [dict(d) for d in current]
    fresh = 0
    for record in records:
        demo = demo_of(record)
        if demo is None or any(
            _same_values(demo, other, record.inputs) or _same_values(demo, other, record.corrected) for other in kept
        ):
            continue
        kept.append(demo)
        fresh += 1
        if fresh == max_demos:
            break
    return kept[-max_demos:] if fresh else None


def pooled(clusters: list[Cluster]) -> list[Cluster]:
    """One cluster per predictor with the members of all its ``clusters``, taken in turn (the first of each
    cluster, in the given order, then the second of each, ...): the first demonstrations then show different
    kinds of failure. Predictors keep the order of their first cluster."""
    by_predictor: dict[str, list[Cluster]] = {}
    for cluster in clusters:
        by_predictor.setdefault(cluster.predictor, []).append(cluster)
    out = []
    for name, group in by_predictor.items():
        depth = max(len(c.members) for c in group)
        members = [c.members[i] for i in range(depth) for c in group if i < len(c.members)]
        out.append(Cluster(name, members, "\n".join(c.text for c in group)))
    return out


def _same_values(demo: Demo, other: Demo, fields: dict) -> bool:
    """Whether ``other`` shows what ``demo`` shows in every one of ``fields`` (its inputs, or its outputs)."""
    return all(other.get(name) == demo[name] for name in fields)
