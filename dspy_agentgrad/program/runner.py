"""Running the program on one example and scoring it: a private copy of the user's program, its
predictors intercepted (:mod:`.interception`), transient errors retried, the metric called unless the
output equals the reference run's.
"""

from __future__ import annotations

import logging
import threading
import traceback
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

import dspy

from ..runtime.budget import Budget
from ..runtime.deadlines import TIMEOUT_ATTEMPTS, CallTimeout, within
from ..runtime.jsonable import digest, example_key, faithful, to_jsonable
from ..runtime.paid_work import AnswerJournal
from ..runtime.redaction import Redactor
from ..runtime.retries import FirstRunsFailed, RetryPolicy, error_kind, is_transient, retry_here, setup_fix
from ..runtime.usage import empty_usage, track
from .awaiting import resolved
from .interception import OutsideCalls, intercept, released
from .metric import Metric, MetricError, checked_score
from .program_state import ProgramState
from .run_control import CONTROL_KEY, RunControl
from .runs import Execution, Outcome, Reference, Step

logger = logging.getLogger("dspy.agentgrad")


class ProgramBug(FirstRunsFailed):
    """The program raised the same error of its own (not an LM error) on each of its first runs."""


RETURNED_NONE = "program:ReturnedNone"
#: Error kinds of a program run and of a metric call abandoned past their time limits (counted as ``timeout``).
TIMEOUT_RUN, TIMEOUT_METRIC = "timeout:run", "timeout:metric"


def _is_async(program: dspy.Module) -> bool:
    """True for a program that defines ``aforward`` but no ``forward`` (run it with ``acall``)."""
    return getattr(type(program), "forward", None) is None and getattr(type(program), "aforward", None) is not None


def check_first_runs(outcomes: list[Outcome], metric_call: str = "metric(example, prediction, trace=None)") -> None:
    """Stop when every one of the program's first runs failed the same way, for a cause no rewrite can fix:
    an error of the program's own, a forward() returning None, a metric that raises, an LM that refuses.
    ``metric_call``: how the metric was called (:attr:`Metric.called_as`), for the message."""
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
            f"the metric raised {name} on {runs}: {detail}. Fix the metric: it was called as {metric_call} and "
            "must return a score; as it is, every run scores failure_score and nothing can be learned"
        )
    if family == "timeout":
        option = "run_timeout_s" if kind == TIMEOUT_RUN else "metric_timeout_s"
        raise FirstRunsFailed(
            f"{runs} went past its time limit twice: {detail}. Raise {option} above the time a run needs, "
            "or find what hangs (a tool, a retriever, the LM server)"
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
    otherwise scored as a failure (``failure_score``, below ``max_score``) with the error
    recorded; they never count as a success. An error the program raises outside any
    predictor call is counted as ``program:<Type>``. A metric that raises scores
    ``failure_score`` too (transient metric errors are retried first); one that returns a
    non-score raises :class:`MetricError` at once.
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
        run_timeout_s: float | None = None,
        metric_timeout_s: float | None = None,
        answers: AnswerJournal | None = None,
    ):
        self.program = student.deepcopy()
        self.run_timeout_s = run_timeout_s
        self.metric_timeout_s = metric_timeout_s
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
        self.hint_delivery = hint_delivery
        self.outside = OutsideCalls()
        self._intercept()

    def _intercept(self) -> None:
        for name, predictor in self.program.named_predictors():
            intercept(predictor, name, self.hint_delivery, self.outside)

    def __getstate__(self) -> dict:
        """What a remote worker needs to make runs (:mod:`.executor`): the program without its hooks, no lock."""
        # the journal stays with the driver: a worker's answers come back with its run
        state = {k: v for k, v in self.__dict__.items() if k not in ("_lock", "outside", "answers")}
        state["program"] = released(self.program)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.answers = None
        self._lock = threading.Lock()
        self.outside = OutsideCalls()
        self._intercept()

    def run(
        self,
        example: dspy.Example,
        instructions: ProgramState | Mapping[str, str],
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
        instructions: ProgramState | Mapping[str, str],
        *,
        hints: dict[str, str] | None = None,
        replay: Iterable[Step] = (),
        reference: Reference | None = None,
        only: dict[str, str] | None = None,
    ) -> Execution:
        """Run the program (retrying transient errors) without scoring it: no metric call. ``only``: per hinted
        predictor, the call key of the calls that get its hint (:class:`.run_control.RunControl`)."""
        attempt = timeouts = 0
        total_usage = empty_usage()
        replay = list(replay)
        reuse = reference.reusable_steps(replay) if reference is not None else []
        track_usage = bool(dspy.settings.get("track_usage"))
        state = ProgramState.of(instructions)
        run = digest([state.key(), example_key(example), hints or {}, only or {}]) if self.answers is not None else ""
        while True:
            attempt += 1
            control = RunControl(state, hints, replay, reuse, self.task_budget, only, self.answers, run)
            lm = {"lm": self.task_model} if self.task_model else {}
            per_lm: dict[str, dict] = {}
            try:
                with track(per_lm) as usage, dspy.context(trace=[], **{CONTROL_KEY: control}, **lm):
                    prediction = within(self.run_timeout_s, "program run", lambda: self._call_program(example))
                error = None
            except Exception as exc:  # LM errors, parse failures: scored as failure, never as success
                prediction, error = None, exc
            if control.capped is not None:  # raised here even when the program caught the refusal
                raise control.capped
            self.outside.check()  # likewise: a predictor the run's context did not reach
            for key in total_usage:
                total_usage[key] += usage[key] + control.journaled_usage[key]  # answers paid before a resume
            timeouts += isinstance(error, CallTimeout)
            if error is not None and self._try_again(error, attempt, timeouts):
                continue
            if track_usage and error is None and hasattr(prediction, "set_lm_usage"):
                prediction.set_lm_usage(per_lm)  # what DSPy attaches under track_usage, from this run's own tracker
            steps = [replace(s, error=self.redact(s.error)) if s.error else s for s in control.steps()]
            misses = control.replay_misses
            return Execution(prediction, error, steps, total_usage, attempt, misses, control.predictor_errors)

    def _call_program(self, example: dspy.Example) -> Any:
        if self.is_async:  # awaited on a fresh event loop (:func:`resolved`)
            return resolved(self.program.acall(**example.inputs()))
        return self.program(**example.inputs())

    def score(self, example: dspy.Example, execution: Execution, reference: Reference | None = None) -> Outcome:
        """The scored outcome of ``execution`` (a metric call, unless its output equals ``reference``'s)."""
        usage, steps, attempts = dict(execution.usage), execution.steps, execution.attempts
        if execution.error is not None:
            error = execution.error
            kind = error_kind(error)
            if isinstance(error, CallTimeout):
                kind = TIMEOUT_RUN
            elif not _raised_in_predictor(error, execution.predictor_errors) and not is_transient(error):
                kind = "program:" + type(error).__name__
            feedback = self.redact(f"The program failed: {kind}: {error}")
            outcome = Outcome(self.failure_score, feedback, kind, steps, {}, usage, attempts)
        elif execution.prediction is None:
            feedback = (
                f"The program failed: {RETURNED_NONE}: {type(self.program).__name__}.forward() returned None; "
                "it must return its outputs (e.g. return dspy.Prediction(answer=...)): check for a missing return"
            )
            outcome = Outcome(self.failure_score, feedback, RETURNED_NONE, steps, {}, usage, attempts)
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
        rerun = reference.rerun_calls(steps) if reference is not None else None
        same = known is not None and known.error is None and outputs == known.outputs
        if same and faithful(prediction):  # values shown by str() alone may print alike and differ: scored
            return Outcome(
                known.score,
                known.feedback,
                None,
                steps,
                outputs,
                total_usage,
                attempts,
                scored=False,
                objectives=dict(known.objectives),
                rerun=rerun,
            )
        attempt = timeouts = 0
        while True:
            attempt += 1
            try:
                with track() as usage:
                    result = within(self.metric_timeout_s, "metric call", lambda: self.metric(example, prediction))
                error = None
            except MetricError:
                raise
            except Exception as exc:
                error = exc
            for key in total_usage:  # an LLM-judge metric's own LM calls
                total_usage[key] += usage[key]
            if error is None:
                score = result.score if self.max_score is None else checked_score(result.score, self.max_score, example)
                feedback = self.redact(result.feedback)
                return Outcome(
                    score,
                    feedback,
                    None,
                    steps,
                    outputs,
                    total_usage,
                    attempts,
                    objectives=result.objectives,
                    rerun=rerun,
                )
            timeouts += isinstance(error, CallTimeout)
            if self._try_again(error, attempt, timeouts):
                continue
            if isinstance(error, CallTimeout):
                kind = TIMEOUT_METRIC
            else:
                self._log_metric_error(error)
                kind = "metric:" + type(error).__name__
            feedback = self.redact(f"The metric failed: {kind}: {error}")
            return Outcome(self.failure_score, feedback, kind, steps, outputs, total_usage, attempts, rerun=rerun)

    def _try_again(self, error: BaseException, attempt: int, timeouts: int) -> bool:
        """Whether to try a failed call again: one past its time limit once, at once (``timeouts``: how many of
        the tries so far were); a transient error after a backoff, while ``retry_attempts`` allows."""
        if isinstance(error, CallTimeout):
            return timeouts < TIMEOUT_ATTEMPTS
        if retry_here(error) and attempt < self.retry.attempts:
            self.retry.wait(attempt, error)
            return True
        return False

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
