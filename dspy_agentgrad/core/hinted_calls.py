"""What a hint did to a run: the predictors' execution order over a batch, the calls of a predictor a hint
changed, and a fixed failure whose fixing call is still to be pinned; and the hinted runs a step may ask for
later (:class:`InterventionPlan`), which the steps name and the speculation layer may run ahead."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from ..program.evaluation import Intervention
from ..program.program_state import ProgramState
from ..program.runs import Outcome, Step


@dataclass(frozen=True)
class InterventionPlan:
    """Hinted runs of ``instructions`` a step may ask for later, in the order it would ask. ``interventions``
    builds them (only when they are run ahead: building one asks for its hint). ``sample``: the hinted runs of
    the round's first level, whose share of unchanged runs tells whether the plans of the round are worth
    running ahead; None for the plans that follow it."""

    instructions: ProgramState
    interventions: Callable[[], list[Intervention]]
    sample: list[Outcome] | None = None


class Lookahead(Protocol):
    """Where the attribution steps name the hinted runs they may ask for later (the speculation layer decides
    whether to run them ahead, so the steps run the same with it or without it)."""

    def expect(self, plan: InterventionPlan) -> None: ...


@dataclass(frozen=True)
class PinCase:
    """A failure some hints fixed, for :meth:`.attribution.Attributor.pin_calls`: the run without the hint on the
    predictor looked at (``witness``), the fixed run, the predictors hinted there, and those of them given a
    placebo."""

    witness: Outcome
    run: Outcome
    targets: tuple[str, ...]
    placebo: frozenset[str] = frozenset()


def _twins(before: list[Step], after: list[Step]) -> list[tuple[Step | None, Step]]:
    """Each call of ``after`` with the call of ``before`` that got the same inputs (each paired once), or None."""
    unpaired, pairs = list(before), []
    for step in after:
        twin = next((s for s in unpaired if s.inputs == step.inputs), None)
        if twin is not None:
            unpaired.remove(twin)
        pairs.append((twin, step))
    return pairs


def changed_calls(before: list[Step], after: list[Step]) -> list[tuple[Step | None, Step]]:
    """The calls of a predictor a hint changed, earliest first: (the call of ``before``, the run without the hint,
    it is paired with, the hinted call). A call is paired with the call of ``before`` that got the same inputs,
    so a call whose inputs changed because an earlier call did is not taken, and the pairing holds when a
    program runs the predictor in threads. When no call that kept its inputs answered differently, calls are
    paired by call number (None: no such call). A hinted call that raised is never a pseudo-label."""

    def differ(pairs: list[tuple[int, Step | None, Step]]) -> list[tuple[int, Step | None, Step]]:
        return [(k, twin, step) for k, twin, step in pairs if twin is None or twin.shown_outputs() != step.outputs]

    changed = differ([(twin.call, twin, step) for twin, step in _twins(before, after) if twin is not None])
    if not changed:
        changed = differ([(k, before[k] if k < len(before) else None, step) for k, step in enumerate(after)])
    return [(twin, step) for _, twin, step in sorted(changed, key=lambda item: item[0]) if not step.error]


def execution_order(outcomes: list[Outcome]) -> list[str]:
    """Predictor names in execution order, aggregated over every run of the batch.

    Each run gives the order in which its predictors are first called. A comes before B
    when more runs call A first than call B first (among runs calling both); predictors
    are ranked by how many others they come before. Ties (including predictors never seen
    in the same run, e.g. on two branches) go by mean first-call rank over the runs that
    call them, then by first appearance over the runs in example order. One run that
    skips a predictor (a branch) therefore cannot reorder the others.
    """
    runs = [outcome.order() for outcome in outcomes]
    names = list(dict.fromkeys(name for run in runs for name in run))
    precedes: Counter[tuple[str, str]] = Counter()
    ranks: dict[str, list[int]] = {name: [] for name in names}
    for run in runs:
        for i, a in enumerate(run):
            ranks[a].append(i)
            for b in run[i + 1 :]:
                precedes[a, b] += 1
    wins = {a: sum(precedes[a, b] > precedes[b, a] for b in names if b != a) for a in names}
    return sorted(names, key=lambda n: (-wins[n], sum(ranks[n]) / len(ranks[n]), names.index(n)))
