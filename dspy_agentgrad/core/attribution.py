"""Steps 1-2 of a round: the failure set and sequential intervention.

Each failure is rerun with a hint on one predictor at a time, latest first, to find the
predictor at fault and its pseudo-label (the output the hint got). Like the engine, this
makes no LM call itself: program runs, hinted or not, go through the :class:`Evaluator`.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import dspy

from ..config import AgentGradConfig
from ..program.evaluation import Evaluator, Intervention
from ..program.hints import Hint, as_hint, leaks_label
from ..program.runs import Outcome
from ..runtime.budget import BudgetExhausted
from .state import AttributionRecord, AttributionReport

logger = logging.getLogger("dspy_agentgrad")

#: Share of a round's first hinted runs that must come out unchanged (reused, no metric call) before the
#: attributor runs the hinted runs the sequential procedure may still need all at once (see ``attribute``).
SPECULATE_WHEN_REUSED = 0.5

HintFn = Callable[[dspy.Example, str, dspy.Prediction, str], "Hint | str | None"]


@dataclass
class Attribution:
    """What steps 1-2 give the engine: the report, each example's run, and whether the hinted runs were
    started ahead (``speculated``: most of them changed nothing, so the round's checks may be stacked too)."""

    report: AttributionReport
    outcomes: list[Outcome]
    speculated: bool = False


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


class Attributor:
    """Attributes a batch's failures to predictors for the program it is given (steps 1-2).

    ``_instructions`` and ``_speculating`` hold the current call's program and mode for its helpers; the
    engine reads neither: :meth:`attribute` returns what it needs as an :class:`Attribution`."""

    def __init__(self, config: AgentGradConfig, evaluator: Evaluator, hint_fn: HintFn):
        self.config = config
        self.evaluator = evaluator
        self.hint_fn = hint_fn
        self.max_score = config.max_score
        self.fix_score = config.max_score if config.fix_threshold is None else config.fix_threshold
        self._instructions: dict[str, str] = {}  # the program of the current call, which hinted runs run
        self._speculating = False  # the current call's hinted runs are started ahead (see ``attribute``)

    def attribute(
        self, instructions: dict[str, str], examples: list[dspy.Example], round_index: int, phase: str = "evaluate"
    ) -> Attribution:
        """Failure set and sequential intervention in reverse execution order.

        A failure goes to the latest predictor whose hint fixes it without copying a revealed
        label into its answer. A leaking fix is kept as a fallback, attributed only when no
        earlier predictor fixes the failure. Failures no single hint fixes get cumulative
        hints (when ``cumulative_hints`` is on).

        The levels are resolved one after the other, as the paper does. When most of the first
        level's hinted runs came out unchanged (so took no metric call), a hint on a predictor
        that is not at fault usually changes nothing in this program: the runs every later level
        and step may need are then started together (``speculating``). The decisions are the
        same (each level reads its runs from the cache); only runs a level would have skipped are
        paid, and those mostly cost no metric call. The engine is told (``Attribution.speculated``).

        ``round_index`` picks the predictor that takes every failure when ``target_identification`` is off.
        """
        self._instructions, self._speculating = instructions, False
        outcomes = self.evaluator.evaluate(instructions, examples, phase)
        order = execution_order(outcomes)
        passed = [i for i, o in enumerate(outcomes) if o.score >= self.max_score]
        unresolved = [i for i, o in enumerate(outcomes) if o.score < self.max_score]
        attributed: dict[str, list[AttributionRecord]] = {name: [] for name in order}
        if not self.config.target_identification:
            self._assign_round_robin(examples, outcomes, unresolved, order, attributed, round_index)
            return Attribution(AttributionReport(order, attributed, [], [examples[i] for i in passed]), outcomes)
        leaked = 0
        fallback: dict[int, tuple[str, AttributionRecord]] = {}
        levels = list(reversed(order))
        for level, name in enumerate(levels):
            hinted = self._hinted(examples, outcomes, [(i, (name,)) for i in unresolved])
            if level == 0 and hinted and self.evaluator.reuse and self.config.speculate:
                reused = sum(not result.scored for _, _, result in hinted)
                self._speculating = reused >= SPECULATE_WHEN_REUSED * len(hinted)
                if self._speculating:
                    self._hinted(examples, outcomes, [(i, (n,)) for n in levels[1:] for i in unresolved])
            for index, hints, result in hinted:
                record = self._fix_record(examples[index], outcomes[index], result, name)
                if record is None:
                    continue
                record.leaked = leaks_label(hints[name], record.inputs, record.corrected)
                if self.config.leak_check and record.leaked:
                    leaked += 1
                    fallback.setdefault(index, (name, record))
                    continue
                attributed[name].append(record)
                unresolved.remove(index)
        for index in [i for i in unresolved if i in fallback]:
            name, record = fallback[index]
            attributed[name].append(record)
            unresolved.remove(index)
        single = len(outcomes) - len(passed) - len(unresolved)
        cumulative = 0
        if self.config.cumulative_hints and unresolved:
            try:
                cumulative = self._cumulative(examples, outcomes, unresolved, order, attributed)
            except BudgetExhausted as stop:
                logger.info("cumulative intervention stopped early: %s", stop)
        report = AttributionReport(
            order,
            attributed,
            [examples[i] for i in unresolved],
            [examples[i] for i in passed],
            leaked,
            explained_single=single,
            explained_cumulative=cumulative,
            replay_misses=sum(o.replay_misses for o in outcomes),
        )
        return Attribution(report, outcomes, self._speculating)

    def _hinted(
        self, examples: list[dspy.Example], outcomes: list[Outcome], items: list[tuple[int, tuple[str, ...]]]
    ) -> list[tuple[int, dict[str, Hint], Outcome]]:
        """Run each failure ``index`` with hints on ``targets``; skips predictors that did not run or got no hint.

        The calls replayed are those of predictors first called before the earliest target in that run.
        """
        jobs: list[tuple[int, dict[str, Hint], Intervention]] = []
        for index, targets in items:
            outcome = outcomes[index]
            run_order = outcome.order()
            if any(t not in run_order for t in targets):
                continue  # a target did not run for this example
            hints = {t: self._hint(examples[index], outcome, t) for t in targets}
            if any(h is None for h in hints.values()):
                continue
            earliest = min(run_order.index(t) for t in targets)
            replay = [step for step in outcome.steps if step.name in run_order[:earliest]]
            texts = {t: h.text for t, h in hints.items()}
            jobs.append((index, hints, Intervention(examples[index], texts, replay, outcome)))
        if not jobs:
            return []
        results = self.evaluator.intervene(self._instructions, [job for _, _, job in jobs])
        return [(index, hints, result) for (index, hints, _), result in zip(jobs, results)]

    def _hint(self, example: dspy.Example, outcome: Outcome, name: str) -> Hint | None:
        """The hint for predictor ``name`` on the failed run ``outcome`` of ``example``."""
        prediction = dspy.Prediction(**outcome.outputs)
        return as_hint(example, self.hint_fn(example, name, prediction, outcome.feedback))

    def _fixes(self, result: Outcome, original: Outcome) -> bool:
        return result.score >= self.fix_score and result.score > original.score

    def _fix_record(
        self, example: dspy.Example, original: Outcome, result: Outcome, name: str, witness: Outcome | None = None
    ) -> AttributionRecord | None:
        """The pseudo-label of predictor ``name`` when ``result`` fixes the failure; None when the run is
        not fixed or the hint changed none of the predictor's outputs.

        The call taken is the earliest one (by call number in ``witness``, the run without this hint;
        the original run by default) that got the same inputs in both runs and answered differently:
        the call the hint changed, not one whose inputs changed because an earlier call did. Calls are
        paired by inputs, so the pairing holds when a program runs the predictor in threads. When no
        call kept its inputs, calls are paired by call number.
        """
        if not self._fixes(result, original):
            return None
        before, after = (witness or original).calls(name), result.calls(name)
        unpaired, changed = list(before), []
        for fixed in after:
            twin = next((step for step in unpaired if step.inputs == fixed.inputs), None)
            if twin is not None:
                unpaired.remove(twin)
                if twin.outputs != fixed.outputs:
                    changed.append((twin.call, twin.outputs, fixed))
        if not changed:
            changed = [
                (k, before[k].outputs if k < len(before) else {}, fixed)
                for k, fixed in enumerate(after)
                if k >= len(before) or before[k].outputs != fixed.outputs
            ]
        if not changed:
            return None
        _, unhinted, fixed = min(changed, key=lambda item: item[0])
        return AttributionRecord(example, fixed.inputs, unhinted, fixed.outputs, original.feedback, original.outputs)

    def _cumulative(self, examples, outcomes, unresolved, order, attributed) -> int:
        """Failures no single hint fixes: keep the hints on later predictors while adding earlier ones.

        Once a set of hints fixes a failure, each later hint is dropped again when the failure stays
        fixed without it (greedy, latest first), and every predictor left in the set whose output
        its hint changed gets a pseudo-label. Returns the number of failures explained.
        """
        chains = {i: [n for n in reversed(order) if n in outcomes[i].order()] for i in unresolved}
        chains = {i: chain for i, chain in chains.items() if len(chain) >= 2}
        explained = 0
        if self._speculating:
            self._hinted(
                examples, outcomes, [(i, tuple(c[:d])) for i, c in chains.items() for d in range(2, len(c) + 1)]
            )
        for depth in range(2, max((len(c) for c in chains.values()), default=0) + 1):
            items = [(i, tuple(chain[:depth])) for i, chain in chains.items() if len(chain) >= depth]
            fixed = {}
            for index, hints, result in self._hinted(examples, outcomes, items):
                if self._fixes(result, outcomes[index]):
                    fixed[index] = (list(hints), result)
                    del chains[index]
            for index, (kept, witnesses, run) in self._prune(examples, outcomes, fixed).items():
                records = {
                    name: self._fix_record(examples[index], outcomes[index], run, name, witnesses.get(name))
                    for name in kept
                }
                records = {n: r for n, r in records.items() if r is not None}
                if not records:
                    continue
                for name, record in records.items():
                    hint = self._hint(examples[index], outcomes[index], name)
                    record.leaked = hint is not None and leaks_label(hint, record.inputs, record.corrected)
                    attributed[name].append(record)
                unresolved.remove(index)
                explained += 1
        return explained

    def _prune(self, examples, outcomes, fixed: dict) -> dict[int, tuple[list[str], dict[str, Outcome], Outcome]]:
        """For each fixed failure: the hinted predictors still needed, for each of them the run without
        its hint (its witness), and the fixed run with exactly those hints."""
        state = {i: (list(targets), {targets[-1]: outcomes[i]}, run) for i, (targets, run) in fixed.items()}
        longest = max((len(targets) for targets, _ in fixed.values()), default=0)
        if self._speculating:  # each drop tried on the full set: the runs needed when no earlier drop holds
            self._hinted(
                examples,
                outcomes,
                [(i, tuple(n for n in t if n != t[p])) for i, (t, _) in fixed.items() for p in range(len(t) - 1)],
            )
        for position in range(longest - 1):
            items = []
            for index, (kept, _, _) in state.items():
                later = fixed[index][0][:-1]
                if position < len(later):
                    items.append((index, tuple(n for n in kept if n != later[position])))
            for index, hints, result in self._hinted(examples, outcomes, items):
                kept, witnesses, _ = state[index]
                dropped = next(n for n in kept if n not in hints)
                if self._fixes(result, outcomes[index]):
                    kept.remove(dropped)
                    state[index] = (kept, witnesses, result)
                else:
                    witnesses[dropped] = result
        return state

    def _assign_round_robin(self, examples, outcomes, unresolved, order, attributed, round_index: int) -> None:
        """Ablation without target identification: this round's predictor takes every failure."""
        if not order:
            return
        name = order[round_index % len(order)]
        hinted = {}
        if self.config.agent_supervision:
            hinted = {i: (h, r) for i, h, r in self._hinted(examples, outcomes, [(i, (name,)) for i in unresolved])}
        for index in unresolved:
            step = outcomes[index].first_step(name)
            if step is None:
                continue
            hints, run = hinted.get(index, ({}, None))
            fixed = run.first_step(name) if run is not None else None
            corrected = fixed.outputs if fixed else {}
            attributed[name].append(
                AttributionRecord(
                    examples[index],
                    step.inputs,
                    step.outputs,
                    corrected,
                    outcomes[index].feedback,
                    outcomes[index].outputs,
                    leaked=bool(corrected) and leaks_label(hints[name], step.inputs, corrected),
                )
            )
