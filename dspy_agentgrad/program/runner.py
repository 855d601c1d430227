"""Running the program on one example and scoring it: a private copy of the user's program, its
predictors intercepted (:mod:`.interception`), transient errors retried, the metric called unless the
output equals the reference run's.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
import traceback
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import dspy

from ..runtime.budget import Budget
from ..runtime.jsonable import digest, example_key, faithful, to_jsonable
from ..runtime.paid_work import AnswerJournal
from ..runtime.redaction import Redactor
from ..runtime.retries import FirstRunsFailed, RetryPolicy, error_kind, is_transient, retry_here, setup_fix
from ..runtime.usage import empty_usage, track
from .interception import CONTROL_KEY, RunControl, intercept
from .metric import Metric, MetricError, check_score_range
from .program_state import ProgramState
from .runs import Execution, Outcome, Reference, Step

logger = logging.getLogger("dspy.agentgrad")


class ProgramBug(FirstRunsFailed):
    """The program raised the same error of its own (not an LM error) on each of its first runs."""


RETURNED_NONE = "program:ReturnedNone"


def _is_async(program: dspy.Module) -> bool:
    """True for a program that defines ``aforward`` but no ``forward`` (run it with ``acall``)."""
    return getattr(type(program), "forward", None) is None and getattr(type(program), "aforward", None) is not None


def _run_async(program: dspy.Module, inputs: dict) -> Any:
    """Run an async-only program to completion in a fresh event loop on a helper thread
    (the caller may already be inside an event loop, e.g. a notebook)."""
    context = contextvars.copy_context()
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(context.run, asyncio.run, program.acall(**inputs)).result()


def check_first_runs(outcomes: list[Outcome]) -> None:
    """Stop when every one of the program's first runs failed the same way, for a cause no rewrite can fix:
    an error of the program's own, a forward() returning None, a metric that raises, an LM that refuses."""
    errors = {o.error for o in outcomes}
    if not outcomes or len(errors) != 1 or None in errors:
        return
    kind = outcomes[0].error
    family, _, name = kind.partition(":")
    detail = outcomes[0].feedback.split(f"{kind}: ", 1)[-1]
    runs = f"each of its first {len(outcomes)} runs"
    if kind == RETURNED_NONE:
        raise ProgramBug(f"the program failed on {runs}: {detail}")
    if family == "program":
        raise ProgramBug(
            f"the program raised {name} on {runs}, outside any LM call (a bug in forward, or example inputs "
            f"that do not match it): {detail}"
        )
    if family == "metric":
        raise FirstRunsFailed(
            f"the metric raised {name} on {runs}: {detail}. Fix the metric: it is called as metric(example, "
            "prediction, trace=None) and must return a score; as it is, every run scores failure_score and "
            "nothing can be learned"
        )
    fix = setup_fix(name)
    if family == "error" and fix is not None:
        raise FirstRunsFailed(
            f"the task LM failed with {name} on {runs} of the program: {detail.strip()}\nTo fix: {fix}"
        )


def _raised_in_predictor(error: BaseException, predictor_errors: list[BaseException]) -> bool:
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if any(current is known for known in predictor_errors):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


class ProgramRunner:
    """Runs a private copy of the user's program under chosen instructions.

    Program errors (LM failures, parse failures) are retried when transient and
    otherwise scored as a failure (score 0) with the error recorded; they never
    count as a success. An error the program raises outside any predictor call is
    counted as ``program:<Type>``. A metric that raises scores ``failure_score``
    (transient metric errors are retried first); one that returns a non-score raises
    :class:`MetricError` at once.
    """

    def __init__(
        self,
        student: dspy.Module,
        metric: Metric,
        task_model: Any = None,
        retry: RetryPolicy | None = None,
        hint_delivery: str = "input_field",
        max_score: float | None = None,
        failure_score: float = 0.0,
        redact: Callable[[str], str] | None = None,
        task_budget: Budget | None = None,
        answers: AnswerJournal | None = None,
    ):
        self.program = student.deepcopy()
        self.answers = answers
        self.redact = redact or Redactor()
        self.task_budget = task_budget if task_budget is not None and task_budget.task_capped else None
        self.max_score = max_score
        self.metric = metric
        self.task_model = task_model
        self.retry = retry or RetryPolicy()
        self.failure_score = failure_score
        self.is_async = _is_async(self.program)
        self._metric_error_logged = False
        self._lock = threading.Lock()
        for name, predictor in self.program.named_predictors():
            intercept(predictor, name, hint_delivery)

    def run(
        self,
        example: dspy.Example,
        instructions: Mapping[str, str],
        *,
        hints: dict[str, str] | None = None,
        replay: Iterable[Step] = (),
        reference: Reference | None = None,
    ) -> Outcome:
        """One scored run; ``replay``: calls that must be replayed; ``reference``: an earlier run to reuse."""
        execution = self.execute(example, instructions, hints=hints, replay=replay, reference=reference)
        return self.score(example, execution, reference)

    def execute(
        self,
        example: dspy.Example,
        instructions: dict[str, str],
        *,
        hints: dict[str, str] | None = None,
        replay: Iterable[Step] = (),
        reference: Reference | None = None,
    ) -> Execution:
        """Run the program (retrying transient errors) without scoring it: no metric call."""
        attempt = 0
        total_usage = empty_usage()
        replay = list(replay)
        reuse = reference.reusable_steps(replay) if reference is not None else []
        track_usage = bool(dspy.settings.get("track_usage"))
        state = ProgramState.of(instructions)
        run = digest([state.key(), example_key(example), hints or {}]) if self.answers is not None else ""
        while True:
            attempt += 1
            control = RunControl(state, hints, replay, reuse, self.task_budget, self.answers, run)
            lm = {"lm": self.task_model} if self.task_model else {}
            per_lm: dict[str, dict] = {}
            try:
                with track(per_lm) as usage, dspy.context(trace=[], **{CONTROL_KEY: control}, **lm):
                    if self.is_async:
                        prediction = _run_async(self.program, example.inputs())
                    else:
                        prediction = self.program(**example.inputs())
                error = None
            except Exception as exc:  # LM errors, parse failures: scored as failure, never as success
                prediction, error = None, exc
            if control.capped is not None:  # raised here even when the program caught the refusal
                raise control.capped
            for key in total_usage:
                total_usage[key] += usage[key] + control.journaled_usage[key]  # answers paid before a resume
            if error is not None and retry_here(error) and attempt < self.retry.attempts:
                self.retry.wait(attempt, error)
                continue
            if track_usage and error is None and hasattr(prediction, "set_lm_usage"):
                prediction.set_lm_usage(per_lm)  # what DSPy attaches under track_usage, from this run's own tracker
            steps, misses = control.steps(), control.replay_misses
            return Execution(prediction, error, steps, total_usage, attempt, misses, control.predictor_errors)

    def score(self, example: dspy.Example, execution: Execution, reference: Reference | None = None) -> Outcome:
        """The scored outcome of ``execution`` (a metric call, unless its output equals ``reference``'s)."""
        usage, steps, attempts = dict(execution.usage), execution.steps, execution.attempts
        if execution.error is not None:
            error = execution.error
            kind = error_kind(error)
            if not _raised_in_predictor(error, execution.predictor_errors) and not is_transient(error):
                kind = "program:" + type(error).__name__
            feedback = self.redact(f"The program failed: {kind}: {error}")
            outcome = Outcome(0.0, feedback, kind, steps, {}, usage, attempts)
        elif execution.prediction is None:
            feedback = (
                f"The program failed: {RETURNED_NONE}: {type(self.program).__name__}.forward() returned None; "
                "it must return its outputs (e.g. return dspy.Prediction(answer=...)): check for a missing return"
            )
            outcome = Outcome(0.0, feedback, RETURNED_NONE, steps, {}, usage, attempts)
        else:
            outcome = self._score(example, execution.prediction, steps, usage, attempts, reference)
        outcome.replay_misses = execution.replay_misses
        return outcome

    def _score(self, example, prediction, steps, total_usage, attempts, reference=None) -> Outcome:
        outputs = (
            to_jsonable(dict(prediction.items()))
            if hasattr(prediction, "items")
            else {"output": to_jsonable(prediction)}
        )
        known = reference.outcome if reference is not None else None
        same = known is not None and known.error is None and outputs == known.outputs
        if same and faithful(prediction):  # values shown by str() alone may print alike and differ: scored
            return Outcome(known.score, known.feedback, None, steps, outputs, total_usage, attempts, scored=False)
        attempt = 0
        while True:
            attempt += 1
            try:
                with track() as usage:
                    result = self.metric(example, prediction)
                error = None
            except MetricError:
                raise
            except Exception as exc:
                error = exc
            for key in total_usage:  # an LLM-judge metric's own LM calls
                total_usage[key] += usage[key]
            if error is None:
                if self.max_score is not None:
                    check_score_range(result.score, self.max_score, example)
                feedback = self.redact(result.feedback)
                return Outcome(result.score, feedback, None, steps, outputs, total_usage, attempts)
            if retry_here(error) and attempt < self.retry.attempts:
                self.retry.wait(attempt, error)
                continue
            self._log_metric_error(error)
            kind = "metric:" + type(error).__name__
            feedback = self.redact(f"The metric failed: {kind}: {error}")
            return Outcome(self.failure_score, feedback, kind, steps, outputs, total_usage, attempts)

    def _log_metric_error(self, error: BaseException) -> None:
        with self._lock:
            if self._metric_error_logged:
                return
            self._metric_error_logged = True
        logger.warning(
            "the metric raised; such runs score failure_score=%s and are counted (first traceback only):\n%s",
            self.failure_score,
            "".join(traceback.format_exception(error)),
        )
