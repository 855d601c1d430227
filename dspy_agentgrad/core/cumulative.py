"""Step 2 for the failures no single hint fixes: cumulative hints, kept on later predictors while earlier ones
are added, then pruned back and checked against placebos, so each predictor left gets a pseudo-label only when
its hint's information was needed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import dspy

from ..config import AgentGradConfig
from ..program.hints import PLACEBOS, Hint, leaks_label
from ..program.runs import Outcome, Step
from .hinted_calls import PinCase
from .state import AttributionRecord


class HintedRuns(Protocol):
    """What the pass asks of the attributor (:class:`.attribution.Attributor`): its hinted runs, where it names
    those it may ask for later, and how it reads a fix and its pseudo-label."""

    config: AgentGradConfig

    def hinted(
        self,
        examples: list[dspy.Example],
        outcomes: list[Outcome],
        items: list[tuple[int, tuple[str, ...]]] | list[tuple[int, tuple[str, ...], set[str]]],
        phase: str = ...,
        variant: int = ...,
        references: dict[int, tuple[Outcome, frozenset[str]]] | None = ...,
    ) -> list[tuple[int, dict[str, Hint], Outcome]]: ...

    def expect(
        self, examples: list[dspy.Example], outcomes: list[Outcome], items: list[tuple[int, tuple[str, ...]]]
    ) -> None: ...

    def hint(self, example: dspy.Example, outcome: Outcome, name: str) -> Hint | None: ...

    def fixes(self, result: Outcome, original: Outcome) -> bool: ...

    def fix_record(
        self,
        example: dspy.Example,
        original: Outcome,
        result: Outcome,
        name: str,
        witness: Outcome | None = ...,
        pin: tuple[Step, Outcome] | None = ...,
    ) -> AttributionRecord | None: ...

    def pin_calls(
        self, examples: list[dspy.Example], outcomes: list[Outcome], name: str, cases: dict[int, PinCase]
    ) -> dict[int, tuple[Step, Outcome]]: ...


@dataclass
class CumulativePass:
    """One round's cumulative pass over the failures of ``examples`` (their runs: ``outcomes``), run through the
    attributor's hinted runs. ``leaks``: hint sets whose fix leaked a label; ``placebo_withheld``: kept hints a
    placebo replaced as well."""

    attributor: HintedRuns
    examples: list[dspy.Example]
    outcomes: list[Outcome]
    leaks: int = 0
    placebo_withheld: int = 0

    def run(self, unresolved: list[int], order: list[str], attributed: dict[str, list[AttributionRecord]]) -> None:
        """Failures no single hint fixes: keep the hints on later predictors while adding earlier ones.

        Once a set of hints fixes a failure, each later hint is dropped again when the failure stays
        fixed without it (greedy, latest first), and every predictor left in the set whose output
        its hint changed gets a pseudo-label. An explained failure leaves ``unresolved`` at once.
        """
        examples, outcomes = self.examples, self.outcomes
        chains = {i: [n for n in reversed(order) if n in outcomes[i].order()] for i in unresolved}
        chains = {i: chain for i, chain in chains.items() if len(chain) >= 2}
        depths = [(i, tuple(c[:d])) for i, c in chains.items() for d in range(2, len(c) + 1)]
        self.attributor.expect(examples, outcomes, depths)
        for depth in range(2, max((len(c) for c in chains.values()), default=0) + 1):
            items = [(i, tuple(chain[:depth])) for i, chain in chains.items() if len(chain) >= depth]
            fixed = {}
            for index, hints, result in self.attributor.hinted(examples, outcomes, items, "cumulative"):
                if self._clean_fix(outcomes[index], result, hints):
                    fixed[index] = (list(hints), result)
                    del chains[index]
            pruned = self._prune(fixed)
            placed = self._placebo(fixed, pruned)
            pins = {}
            for name in order:
                cases = {
                    i: PinCase(
                        witnesses.get(name, outcomes[i]),
                        run,
                        tuple(n for n in fixed[i][0] if n in kept or n in placed[i]),
                        frozenset(placed[i]),
                    )
                    for i, (kept, witnesses, run) in pruned.items()
                    if name in kept
                }
                pins[name] = self.attributor.pin_calls(examples, outcomes, name, cases)
            for index, (kept, witnesses, run) in pruned.items():
                records = {
                    name: self.attributor.fix_record(
                        examples[index], outcomes[index], run, name, witnesses.get(name), pins[name].get(index)
                    )
                    for name in kept
                }
                records = {n: r for n, r in records.items() if r is not None}
                if not records:
                    continue
                for name, record in records.items():
                    hint = self.attributor.hint(examples[index], outcomes[index], name)
                    record.leaked = hint is not None and leaks_label(hint, record.inputs, record.corrected)
                    attributed[name].append(record)
                unresolved.remove(index)

    def _prune(self, fixed: dict) -> dict[int, tuple[list[str], dict[str, Outcome], Outcome]]:
        """For each fixed failure: the hinted predictors still needed, for each of them the run without
        its hint (its witness), and the fixed run with exactly those hints."""
        examples, outcomes = self.examples, self.outcomes
        state = {i: (list(targets), {targets[-1]: outcomes[i]}, run) for i, (targets, run) in fixed.items()}
        longest = max((len(targets) for targets, _ in fixed.values()), default=0)
        # each drop tried on the full set: the runs needed when no earlier drop holds
        drops = [(i, tuple(n for n in t if n != t[p])) for i, (t, _) in fixed.items() for p in range(len(t) - 1)]
        self.attributor.expect(examples, outcomes, drops)
        for position in range(longest - 1):
            items = []
            for index, (kept, _, _) in state.items():
                later = fixed[index][0][:-1]
                if position < len(later):
                    items.append((index, tuple(n for n in kept if n != later[position])))
            for index, hints, result in self.attributor.hinted(examples, outcomes, items, "cumulative"):
                kept, witnesses, _ = state[index]
                dropped = next(n for n in kept if n not in hints)
                if self._clean_fix(outcomes[index], result, hints):
                    kept.remove(dropped)
                    state[index] = (kept, witnesses, result)
                else:
                    witnesses[dropped] = result
        return state

    def _placebo(self, fixed: dict, pruned: dict) -> dict[int, set[str]]:
        """The causal control of a kept hint: dropping it also reverts its predictor's prompt, so under an LM
        that rewords its output whenever its prompt changes, a fix may come from that wording alone (and the
        earliest hint, added last, is never dropped at all). Each kept hint but the latest (a wording can only
        have mattered through a later hinted predictor that reads it), earliest first, is replaced by a placebo
        (the same kind of prompt change, no information), under each placebo wording in turn; when one still
        fixes the failure cleanly, the hint's information was not what mattered: its predictor gets no
        pseudo-label, keeps the placebo, and the others' labels are taken from the placebo run. Compares
        outcomes, never texts. A placebo run reuses the run without that hint (its witness), so under reuse a
        placebo that leaves its predictor's output as it was costs no metric call (an LM that does not reword
        pays nothing for the control)."""
        examples, outcomes = self.examples, self.outcomes
        placed: dict[int, set[str]] = {i: set() for i in pruned}
        for position in range(max((len(kept) for kept, _, _ in pruned.values()), default=0)):
            testing = {}
            for index, (kept, _, _) in pruned.items():
                untested = [n for n in reversed(fixed[index][0]) if n in kept[1:]][position - len(placed[index]) :]
                if untested:
                    testing[index] = untested[0]
            for variant in range(len(PLACEBOS)):
                items = [
                    (i, tuple(n for n in fixed[i][0] if n in pruned[i][0] or n in placed[i]), placed[i] | {name})
                    for i, name in testing.items()
                ]
                refs = {i: (pruned[i][1][name], frozenset(fixed[i][0])) for i, name in testing.items()}
                for index, hints, result in self.attributor.hinted(
                    examples, outcomes, items, "cumulative", variant=variant, references=refs
                ):
                    if self._clean_fix(outcomes[index], result, hints):
                        kept, witnesses, _ = pruned[index]
                        kept.remove(testing[index])
                        placed[index].add(testing.pop(index))
                        self.placebo_withheld += 1
                        pruned[index] = (kept, witnesses, result)
        return placed

    def _clean_fix(self, original: Outcome, result: Outcome, hints: dict[str, Hint]) -> bool:
        """A set of hints fixed the failure, and no hinted predictor did it by copying a label its hint revealed
        (with ``leak_check``): the cumulative pass's leak check. A leaking set counts as not fixing, so the
        pass goes on to earlier predictors, and pruning keeps a hint whose drop leaves only a leaking fix."""
        if not self.attributor.fixes(result, original):
            return False
        if not self.attributor.config.attribution.leak_check:
            return True
        leaks = any(
            leaks_label(hint, step.inputs, step.outputs) for n, hint in hints.items() for step in result.calls(n)
        )
        if leaks:
            self.leaks += 1
        return not leaks
