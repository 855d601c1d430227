"""Steps 1-2 of a round: the failure set and sequential intervention.

Each failure is rerun with a hint on one predictor at a time, latest first, to find the
predictor at fault and its pseudo-label (the output the hint got). Like the engine, this
makes no LM call itself: program runs, hinted or not, go through the :class:`Evaluator`.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import dspy

from ..config import AgentGradConfig
from ..program.evaluation import Evaluator, Intervention
from ..program.hints import PLACEBOS, Hint, as_hint, leaks_label
from ..program.run_control import call_key
from ..program.runs import Outcome, Step
from ..runtime.budget import BudgetExhausted
from ..runtime.jsonable import digest
from .state import AttributionRecord, AttributionReport

logger = logging.getLogger("dspy.agentgrad")

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


@dataclass(frozen=True)
class PinCase:
    """A failure some hints fixed, for :meth:`Attributor._pin_calls`: the run without the hint on the predictor
    looked at (``witness``), the fixed run, the predictors hinted there, and those of them given a placebo."""

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
        self._instructions: Mapping[str, str] = {}  # the program of the current call, which hinted runs run
        self._speculating = False  # the current call's hinted runs are started ahead (see ``attribute``)
        self._cumulative_leaks = 0  # hint sets of the current call's cumulative pass whose fix leaked a label
        self._placebo_withheld = 0  # hints of the current call's cumulative fixes that a placebo replaced as well

    def attribute(
        self, instructions: Mapping[str, str], examples: list[dspy.Example], round_index: int, phase: str = "evaluate"
    ) -> Attribution:
        """Failure set and sequential intervention in reverse execution order.

        A failure goes to the latest predictor whose hint fixes it without copying a revealed
        label into its answer. A leaking fix is kept as a fallback, attributed only when no
        earlier predictor fixes the failure. Failures no single hint fixes get cumulative
        hints (when ``cumulative_hints`` is on).

        The levels are resolved one after the other, as the paper does. When most of the first
        level's hinted runs came out unchanged (so took no metric call), a hint on a predictor
        that is not at fault usually changes nothing in this program: the program runs every later
        level and step may need are then made together, ahead, unscored (``speculating``). Each
        level then scores (and pays for) only the runs it asks for, as without speculation, so the
        decisions and the metric calls are the same under any budget; the runs no level asks for
        cost LM calls only. The engine is told (``Attribution.speculated``).

        ``round_index`` picks the predictor that takes every failure when ``target_identification`` is off.
        """
        self._instructions, self._speculating, self._cumulative_leaks = instructions, False, 0
        self._placebo_withheld = 0
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
                    self._hinted(examples, outcomes, [(i, (n,)) for n in levels[1:] for i in unresolved], ahead=True)
            cases = {i: PinCase(outcomes[i], run, (name,)) for i, _, run in hinted if self._fixes(run, outcomes[i])}
            pins = self._pin_calls(examples, outcomes, name, cases)
            for index, hints, result in hinted:
                record = self._fix_record(examples[index], outcomes[index], result, name, pin=pins.get(index))
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
        if self.config.cumulative_hints and unresolved:
            try:
                self._cumulative(examples, outcomes, unresolved, order, attributed)
            except BudgetExhausted as stop:  # what it explained before the stop stays explained
                logger.info("cumulative intervention stopped early: %s", stop)
        cumulative = len(outcomes) - len(passed) - len(unresolved) - single
        report = AttributionReport(
            order,
            attributed,
            [examples[i] for i in unresolved],
            [examples[i] for i in passed],
            leaked + self._cumulative_leaks,
            explained_single=single,
            explained_cumulative=cumulative,
            replay_misses=sum(o.replay_misses for o in outcomes),
            placebo_withheld=self._placebo_withheld,
        )
        return Attribution(report, outcomes, self._speculating)

    def _hinted(
        self,
        examples: list[dspy.Example],
        outcomes: list[Outcome],
        items: list[tuple[int, tuple[str, ...]]] | list[tuple[int, tuple[str, ...], set[str]]],
        phase: str = "intervene",
        ahead: bool = False,
        variant: int = 0,
        references: dict[int, tuple[Outcome, frozenset[str]]] | None = None,
        only: dict[int, dict[str, str]] | None = None,
    ) -> list[tuple[int, dict[str, Hint], Outcome]]:
        """Run each failure ``index`` with hints on ``targets``; skips predictors that did not run or got no hint.

        The calls replayed are those of predictors first called before the earliest target in that run.
        ``ahead``: only run the programs, unscored, for a later call to score (speculation); returns nothing.
        An item may name a third part: the targets that get the placebo ``PLACEBOS[variant]`` instead of their hint.
        ``references``: for a failure, the run to reuse calls and score from instead of the failure's own, and
        the predictors hinted there (their calls, like the targets', are made anew). ``only``: for a failure,
        the targets whose hint reaches only their calls with a given call key (:func:`call_key`).
        """
        references, only = references or {}, only or {}
        jobs: list[tuple[int, dict[str, Hint], Intervention]] = []
        for index, targets, *placebo in items:
            outcome = outcomes[index]
            run_order = outcome.order()
            if any(t not in run_order for t in targets):
                continue  # a target did not run for this example
            hints = {
                t: PLACEBOS[variant] if placebo and t in placebo[0] else self._hint(examples[index], outcome, t)
                for t in targets
            }
            if any(h is None for h in hints.values()):
                continue
            earliest = min(run_order.index(t) for t in targets)
            replay = [step for step in outcome.steps if step.name in run_order[:earliest]]
            texts = {t: h.text for t, h in hints.items()}
            reference, differs = references.get(index, (outcome, frozenset()))
            job = Intervention(examples[index], texts, replay, reference, differs, only.get(index, {}))
            jobs.append((index, hints, job))
        if not jobs:
            return []
        if ahead:
            self.evaluator.intervene_ahead(self._instructions, [job for _, _, job in jobs])
            return []
        results = self.evaluator.intervene(self._instructions, [job for _, _, job in jobs], phase)
        return [(index, hints, result) for (index, hints, _), result in zip(jobs, results)]

    def _clean_fix(self, original: Outcome, result: Outcome, hints: dict[str, Hint]) -> bool:
        """A set of hints fixed the failure, and no hinted predictor did it by copying a label its hint revealed
        (with ``leak_check``): the cumulative pass's leak check. A leaking set counts as not fixing, so the
        pass goes on to earlier predictors, and pruning keeps a hint whose drop leaves only a leaking fix."""
        if not self._fixes(result, original):
            return False
        if not self.config.leak_check:
            return True
        leaks = any(
            leaks_label(hint, step.inputs, step.outputs) for n, hint in hints.items() for step in result.calls(n)
        )
        if leaks:
            self._cumulative_leaks += 1
        return not leaks

    def _hint(self, example: dspy.Example, outcome: Outcome, name: str) -> Hint | None:
        """The hint for predictor ``name`` on the failed run ``outcome`` of ``example``."""
        prediction = dspy.Prediction(**outcome.outputs)
        return as_hint(example, self.hint_fn(example, name, prediction, outcome.feedback))

    def _fixes(self, result: Outcome, original: Outcome) -> bool:
        return result.score >= self.fix_score and result.score > original.score

    def _fix_record(
        self,
        example: dspy.Example,
        original: Outcome,
        result: Outcome,
        name: str,
        witness: Outcome | None = None,
        pin: tuple[Step, Outcome] | None = None,
    ) -> AttributionRecord | None:
        """The pseudo-label of predictor ``name`` when ``result`` fixes the failure; None when the run is
        not fixed or the hint changed none of the predictor's outputs.

        ``pin``: the call the hint fixed, found by :meth:`_pin_calls` (a call of ``witness``, the run without
        this hint, the original run by default), and the run where only that call got the hint: the label is
        that call's answer there. Otherwise the call taken is the one :func:`changed_calls` lists first.
        """
        if not self._fixes(result, original):
            return None
        if pin is not None:
            call, run = pin
            key = call_key(name, call.inputs, call.setting)
            fixed = next(s for s in run.calls(name) if not s.error and call_key(name, s.inputs, s.setting) == key)
            return AttributionRecord(
                example, fixed.inputs, call.shown_outputs(), fixed.outputs, original.feedback, original.outputs
            )
        changed = changed_calls((witness or original).calls(name), result.calls(name))
        if not changed:
            return None
        twin, fixed = changed[0]
        unhinted = twin.shown_outputs() if twin is not None else {}
        return AttributionRecord(example, fixed.inputs, unhinted, fixed.outputs, original.feedback, original.outputs)

    def _pin_calls(
        self, examples: list[dspy.Example], outcomes: list[Outcome], name: str, cases: dict[int, PinCase]
    ) -> dict[int, tuple[Step, Outcome]]:
        """For each failure a set of hints fixed (``cases``) where more than one call of ``name`` answered anew,
        the call the hint on ``name`` fixed, and the run that shows it.

        An LM that words its answer anew whenever its prompt changes makes a hint change every call of a
        predictor called several times, so which answer mattered cannot be read from the texts. The calls of the
        run without the hint are tried one at a time, each alone getting the hint (the others of the fixing set
        keep theirs): first the call :func:`changed_calls` would take, then the others, latest first (the nearest
        to the output). The first whose hint alone fixes the failure is the call the hint fixed. Each try takes
        the fixed run as reference, so a try whose output equals it costs no metric call (under an LM that does
        not reword, the first try). No try fixes: no pin (the first changed call is taken)."""
        pending: dict[int, list[Step]] = {}
        for index, case in cases.items():
            before, after = case.witness.calls(name), case.run.calls(name)
            kept = {(digest(t.inputs), digest(t.outputs)) for t in before}
            if sum(not s.error and (digest(s.inputs), digest(s.outputs)) not in kept for s in after) < 2:
                continue  # one call (or none) answered anew: changed_calls finds it
            first = [twin for twin, _ in changed_calls(before, after)[:1] if twin is not None]
            tries = {call_key(name, s.inputs, s.setting): s for s in [*first, *reversed(before)]}
            pending[index] = list(tries.values())
        pins: dict[int, tuple[Step, Outcome]] = {}
        phase = "intervene" if all(len(case.targets) == 1 for case in cases.values()) else "cumulative"
        for position in range(max((len(tries) for tries in pending.values()), default=0)):
            live = {i: tries[position] for i, tries in pending.items() if position < len(tries) and i not in pins}
            items = [(i, cases[i].targets, cases[i].placebo) for i in live]
            references = {i: (cases[i].run, frozenset()) for i in live}
            only = {i: {name: call_key(name, call.inputs, call.setting)} for i, call in live.items()}
            for index, _, result in self._hinted(examples, outcomes, items, phase, references=references, only=only):
                if self._fixes(result, outcomes[index]):
                    pins[index] = (live[index], result)
        return pins

    def _cumulative(self, examples, outcomes, unresolved, order, attributed) -> None:
        """Failures no single hint fixes: keep the hints on later predictors while adding earlier ones.

        Once a set of hints fixes a failure, each later hint is dropped again when the failure stays
        fixed without it (greedy, latest first), and every predictor left in the set whose output
        its hint changed gets a pseudo-label. An explained failure leaves ``unresolved`` at once.
        """
        chains = {i: [n for n in reversed(order) if n in outcomes[i].order()] for i in unresolved}
        chains = {i: chain for i, chain in chains.items() if len(chain) >= 2}
        if self._speculating:
            depths = [(i, tuple(c[:d])) for i, c in chains.items() for d in range(2, len(c) + 1)]
            self._hinted(examples, outcomes, depths, ahead=True)
        for depth in range(2, max((len(c) for c in chains.values()), default=0) + 1):
            items = [(i, tuple(chain[:depth])) for i, chain in chains.items() if len(chain) >= depth]
            fixed = {}
            for index, hints, result in self._hinted(examples, outcomes, items, "cumulative"):
                if self._clean_fix(outcomes[index], result, hints):
                    fixed[index] = (list(hints), result)
                    del chains[index]
            pruned = self._prune(examples, outcomes, fixed)
            placed = self._placebo(examples, outcomes, fixed, pruned)
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
                pins[name] = self._pin_calls(examples, outcomes, name, cases)
            for index, (kept, witnesses, run) in pruned.items():
                records = {
                    name: self._fix_record(
                        examples[index], outcomes[index], run, name, witnesses.get(name), pins[name].get(index)
                    )
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
                ahead=True,
            )
        for position in range(longest - 1):
            items = []
            for index, (kept, _, _) in state.items():
                later = fixed[index][0][:-1]
                if position < len(later):
                    items.append((index, tuple(n for n in kept if n != later[position])))
            for index, hints, result in self._hinted(examples, outcomes, items, "cumulative"):
                kept, witnesses, _ = state[index]
                dropped = next(n for n in kept if n not in hints)
                if self._clean_fix(outcomes[index], result, hints):
                    kept.remove(dropped)
                    state[index] = (kept, witnesses, result)
                else:
                    witnesses[dropped] = result
        return state

    def _placebo(self, examples, outcomes, fixed: dict, pruned: dict) -> dict[int, set[str]]:
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
                for index, hints, result in self._hinted(
                    examples, outcomes, items, "cumulative", variant=variant, references=refs
                ):
                    if self._clean_fix(outcomes[index], result, hints):
                        kept, witnesses, _ = pruned[index]
                        kept.remove(testing[index])
                        placed[index].add(testing.pop(index))
                        self._placebo_withheld += 1
                        pruned[index] = (kept, witnesses, result)
        return placed

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
