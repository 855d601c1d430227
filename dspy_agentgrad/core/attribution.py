"""Steps 1-2 of a round: the failure set and sequential intervention.

Each failure is rerun with a hint on one predictor at a time, latest first, to find the
predictor at fault and its pseudo-label (the output the hint got). Like the engine, this
makes no LM call itself: program runs, hinted or not, go through the :class:`Evaluator`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import dspy

from ..config import AgentGradConfig
from ..program.evaluation import Evaluator, Intervention
from ..program.hints import PLACEBOS, Hint, as_hint, leaks_label
from ..program.program_state import ProgramState
from ..program.run_control import call_key
from ..program.runs import Outcome, Step
from ..runtime.budget import BudgetExhausted
from ..runtime.jsonable import digest
from .cumulative import CumulativePass
from .hinted_calls import InterventionPlan, Lookahead, PinCase, changed_calls, execution_order
from .state import AttributionRecord, AttributionReport

logger = logging.getLogger("dspy.agentgrad")

HintFn = Callable[[dspy.Example, str, dspy.Prediction, str], "Hint | str | None"]


@dataclass
class Attribution:
    """What steps 1-2 give the engine: the report and each example's run."""

    report: AttributionReport
    outcomes: list[Outcome]
    budget_stop: str | None = None  # a cap that stopped the cumulative pass: its failures left are hard cases

    @property
    def failures(self) -> int:
        """The batch's failures: its runs below the top score."""
        return len(self.outcomes) - len(self.report.passed)


class Attributor:
    """Attributes a batch's failures to predictors for the program it is given (steps 1-2).

    ``_instructions`` holds the current call's program for its helpers (and the cumulative pass,
    :class:`.cumulative.CumulativePass`); the engine does not read it: :meth:`attribute` returns what it needs as
    an :class:`Attribution`. The hinted runs a step may ask for later are named to ``lookahead``
    (:meth:`expect`), which may run them ahead; the steps run the same either way."""

    def __init__(self, config: AgentGradConfig, evaluator: Evaluator, hint_fn: HintFn, lookahead: Lookahead):
        self.config = config
        self.evaluator = evaluator
        self.hint_fn = hint_fn
        self.lookahead = lookahead
        self.max_score = config.scores.max_score
        self.fix_score = config.scores.max_score if config.scores.fix_threshold is None else config.scores.fix_threshold
        self._instructions = ProgramState({})  # the program of the current call, which hinted runs run

    def attribute(
        self,
        instructions: ProgramState,
        examples: list[dspy.Example],
        round_index: int,
        phase: str = "evaluate",
        revisits: set[int] | None = None,
    ) -> Attribution:
        """Failure set and sequential intervention in reverse execution order.

        A failure goes to the latest predictor whose hint fixes it without copying a revealed
        label into its answer. A leaking fix is kept as a fallback, attributed only when no
        earlier predictor fixes the failure. Failures no single hint fixes get cumulative
        hints (``cumulative_hints``; with "revisits", only those at the positions ``revisits`` names, of examples
        an earlier batch held; None: all, as for a lone attribution).

        The levels are resolved one after the other, as the paper does. Once the first level's
        hinted runs are in, the runs every later level may need are named to the lookahead, with
        those first runs as its sample (:meth:`expect`); each level then scores (and pays for) only
        the runs it asks for, whether or not they were made ahead.

        ``round_index`` picks the predictor that takes every failure when ``target_identification`` is off.
        """
        self._instructions = instructions
        outcomes = self.evaluator.evaluate(instructions, examples, phase)
        order = execution_order(outcomes)
        passed = [i for i, o in enumerate(outcomes) if o.score >= self.max_score]
        unresolved = [i for i, o in enumerate(outcomes) if o.score < self.max_score]
        attributed: dict[str, list[AttributionRecord]] = {name: [] for name in order}
        if not self.config.attribution.target_identification:
            self._assign_round_robin(examples, outcomes, unresolved, order, attributed, round_index)
            return Attribution(AttributionReport(order, attributed, [], [examples[i] for i in passed]), outcomes)
        leaked = 0
        fallback: dict[int, tuple[str, AttributionRecord]] = {}
        levels = list(reversed(order))
        for level, name in enumerate(levels):
            hinted = self.hinted(examples, outcomes, [(i, (name,)) for i in unresolved])
            if level == 0:
                later = [(i, (n,)) for n in levels[1:] for i in unresolved]
                self.expect(examples, outcomes, later, sample=[result for _, _, result in hinted])
            cases = {i: PinCase(outcomes[i], run, (name,)) for i, _, run in hinted if self.fixes(run, outcomes[i])}
            pins = self.pin_calls(examples, outcomes, name, cases)
            for index, hints, result in hinted:
                record = self.fix_record(examples[index], outcomes[index], result, name, pin=pins.get(index))
                if record is None:
                    continue
                record.leaked = leaks_label(hints[name], record.inputs, record.corrected)
                if self.config.attribution.leak_check and record.leaked:
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
        cumulative_pass, budget_stop = CumulativePass(self, examples, outcomes), None
        now, later = self._cumulative_failures(unresolved, revisits)
        if now:
            left = list(now)  # the pass removes what it explains
            try:
                cumulative_pass.run(left, order, attributed)
            except BudgetExhausted as stop:  # what it explained before the stop stays explained
                logger.info("cumulative intervention stopped early: %s", stop)
                budget_stop = f"{stop}; {len(left)} failure(s) left unexplained"
            explained = set(now) - set(left)
            unresolved = [i for i in unresolved if i not in explained]
        cumulative = len(outcomes) - len(passed) - len(unresolved) - single
        report = AttributionReport(
            order,
            attributed,
            [examples[i] for i in unresolved],
            [examples[i] for i in passed],
            leaked + cumulative_pass.leaks,
            explained_single=single,
            explained_cumulative=cumulative,
            replay_misses=sum(o.replay_misses for o in outcomes),
            placebo_withheld=cumulative_pass.placebo_withheld,
            cumulative_deferred=len(later),
        )
        return Attribution(report, outcomes, budget_stop)

    def _cumulative_failures(self, unresolved: list[int], revisits: set[int] | None) -> tuple[list[int], list[int]]:
        """The failures no single hint fixed that get cumulative hints now, and those that wait for their example's
        next batch. With "revisits", a failure whose example is in its first batch waits: at the start of a run most
        failures have several faults, and the single-hint fixes of the same round often resolve them, so the pass
        would pay for hinted runs whose lesson the next rewrite teaches anyway."""
        mode = self.config.attribution.cumulative_hints
        if mode != "revisits":
            return (list(unresolved) if mode else []), []
        now = [i for i in unresolved if revisits is None or i in revisits]
        return now, [i for i in unresolved if i not in now]

    def hinted(
        self,
        examples: list[dspy.Example],
        outcomes: list[Outcome],
        items: list[tuple[int, tuple[str, ...]]] | list[tuple[int, tuple[str, ...], set[str]]],
        phase: str = "intervene",
        variant: int = 0,
        references: dict[int, tuple[Outcome, frozenset[str]]] | None = None,
        only: dict[int, dict[str, str]] | None = None,
    ) -> list[tuple[int, dict[str, Hint], Outcome]]:
        """Run each failure ``index`` with hints on ``targets``; skips predictors that did not run or got no hint.

        The calls replayed are those of predictors first called before the earliest target in that run.
        An item may name a third part: the targets that get the placebo ``PLACEBOS[variant]`` instead of their hint.
        ``references``: for a failure, the run to reuse calls and score from instead of the failure's own, and
        the predictors hinted there (their calls, like the targets', are made anew). ``only``: for a failure,
        the targets whose hint reaches only their calls with a given call key (:func:`call_key`).
        """
        jobs = self._jobs(examples, outcomes, items, variant, references or {}, only or {})
        if not jobs:
            return []
        results = self.evaluator.intervene(self._instructions, [job for _, _, job in jobs], phase)
        return [(index, hints, result) for (index, hints, _), result in zip(jobs, results)]

    def expect(
        self,
        examples: list[dspy.Example],
        outcomes: list[Outcome],
        items: list[tuple[int, tuple[str, ...]]],
        sample: list[Outcome] | None = None,
    ) -> None:
        """Name to the lookahead the hinted runs ``items`` (as :meth:`hinted` takes them) a later step may ask
        for; ``sample``: see :class:`InterventionPlan`."""

        def interventions() -> list[Intervention]:
            return [job for _, _, job in self._jobs(examples, outcomes, items, 0, {}, {})]

        self.lookahead.expect(InterventionPlan(self._instructions, interventions, sample))

    def _jobs(
        self,
        examples: list[dspy.Example],
        outcomes: list[Outcome],
        items: list[tuple[int, tuple[str, ...]]] | list[tuple[int, tuple[str, ...], set[str]]],
        variant: int,
        references: dict[int, tuple[Outcome, frozenset[str]]],
        only: dict[int, dict[str, str]],
    ) -> list[tuple[int, dict[str, Hint], Intervention]]:
        """The hinted runs of ``items`` (see :meth:`hinted`), each with its failure's index and its hints."""
        jobs: list[tuple[int, dict[str, Hint], Intervention]] = []
        for index, targets, *placebo in items:
            outcome = outcomes[index]
            run_order = outcome.order()
            if any(t not in run_order for t in targets):
                continue  # a target did not run for this example
            hints = {
                t: PLACEBOS[variant] if placebo and t in placebo[0] else self.hint(examples[index], outcome, t)
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
        return jobs

    def hint(self, example: dspy.Example, outcome: Outcome, name: str) -> Hint | None:
        """The hint for predictor ``name`` on the failed run ``outcome`` of ``example``."""
        prediction = dspy.Prediction(**outcome.outputs)
        return as_hint(example, self.hint_fn(example, name, prediction, outcome.feedback))

    def fixes(self, result: Outcome, original: Outcome) -> bool:
        return result.score >= self.fix_score and result.score > original.score

    def fix_record(
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

        ``pin``: the call the hint fixed, found by :meth:`pin_calls` (a call of ``witness``, the run without
        this hint, the original run by default), and the run where only that call got the hint: the label is
        that call's answer there. Otherwise the call taken is the one :func:`changed_calls` lists first.
        """
        if not self.fixes(result, original):
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

    def pin_calls(
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
            for index, _, result in self.hinted(examples, outcomes, items, phase, references=references, only=only):
                if self.fixes(result, outcomes[index]):
                    pins[index] = (live[index], result)
        return pins

    def _assign_round_robin(self, examples, outcomes, unresolved, order, attributed, round_index: int) -> None:
        """Ablation without target identification: this round's predictor takes every failure."""
        if not order:
            return
        name = order[round_index % len(order)]
        hinted = {}
        if self.config.abstraction.agent_supervision:
            hinted = {i: (h, r) for i, h, r in self.hinted(examples, outcomes, [(i, (name,)) for i in unresolved])}
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
