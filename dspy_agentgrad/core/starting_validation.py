"""The starting program's validation pass: the first bar every candidate must clear.

The first candidate's check is the first thing that needs its scores, so with several threads it runs beside
round 0's attribution and proposals, when that cannot change what either does; everything that judges waits for it
through :meth:`StartingValidation.finish`.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor

import dspy

from ..program.evaluation import Evaluator
from ..program.objectives import check_guarded_objectives
from ..program.runs import Outcome
from ..runtime.budget import Budget
from ..runtime.jsonable import example_key
from ..runtime.parallel import in_background
from .events import Dispatcher, ValidationScored
from .state import RunState, example_label

logger = logging.getLogger("dspy.agentgrad")
VALIDATION_PASS = "starting validation"  # the budget's purpose for the starting program's validation pass


class StartingValidation:
    """Runs, waits for and records the starting program's validation pass."""

    def __init__(
        self,
        evaluator: Evaluator,
        budget: Budget,
        state: RunState,
        trainset: list[dspy.Example],
        valset: list[dspy.Example],
        emit: Dispatcher,
        num_threads: int,
        objective_guards: Mapping[str, float] | None,
    ):
        self.evaluator = evaluator
        self.budget = budget
        self.state = state
        self.trainset = trainset
        self.valset = valset
        self.emit = emit
        self.num_threads = num_threads
        self.objective_guards = objective_guards
        self._running: Future | None = None  # the pass, while it runs beside round 0

    def start(self, background: ThreadPoolExecutor) -> None:
        """The pass: beside round 0 when that cannot change what either does.

        Its metric calls are set aside before round 0 starts, so round 0 has the budget it would have after the
        pass at one thread; under a task-LM cap (whose calls cannot be set aside) it runs first, as at one thread.
        """
        instructions = self.state.instructions
        cost = self.evaluator.cost(instructions, self.valset)

        def validate() -> list[Outcome]:
            with in_background(), self.budget.drawing_on(VALIDATION_PASS):
                return self.evaluator.evaluate(instructions, self.valset, "validate")

        train_keys = {example_key(ex) for ex in self.trainset}
        overlap = (
            self.num_threads > 1
            and not self.budget.task_capped
            and cost <= self.budget.remaining()
            and not any(example_key(ex) in train_keys for ex in self.valset)
        )
        if overlap:
            self.budget.set_aside(cost, VALIDATION_PASS)
            self._running = background.submit(contextvars.copy_context().run, validate)
        else:
            self._record(validate())

    def finish(self) -> None:
        """Wait for the pass when it runs beside the round (raising what it raised), and record it."""
        if self._running is None:
            return
        outcomes, self._running = self._running.result(), None
        self._record(outcomes)

    def settle(self) -> None:
        """On the way out: record the pass if it was paid; a failure of it was already reported."""
        if self._running is None:
            return
        try:
            self.finish()
        except Exception as error:  # the run is stopping for another reason, told in stop_reason
            logger.info("the starting program's validation pass did not finish: %s", error)
            self._running = None

    def _record(self, outcomes: list[Outcome]) -> None:
        state = self.state
        state.set_best(outcomes)
        state.initial_val_scores = list(state.best_val_scores)
        state.initial_val_objectives = dict(state.best_val_objectives)
        check_guarded_objectives(self.objective_guards, state.initial_val_objectives)
        state.val_labels = [example_label(e) for e in self.valset]
        state.initial_val_score = state.best_val_score
        state.val_history.append((len(self.valset), state.best_val_score))
        self.emit(
            "on_validation_scored",
            ValidationScored(None, state.best_val_score, state.best_val_score, len(self.valset)),
        )
