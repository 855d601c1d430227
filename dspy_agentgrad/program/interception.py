"""The interception of the predictors of the optimizer's private copy of the program: each call runs
under the run's instructions and hint, or is replayed from an earlier call.

The optimizer never edits the user's program: it works on a private copy whose
predictors are intercepted once. Everything that differs between runs (the
instructions, the hints, the calls to replay, the record of calls) travels in a
:class:`.run_control.RunControl` carried in DSPy's own settings overrides (``dspy.context``), so it
reaches every place DSPy runs a predictor: worker threads of ``dspy.Parallel``,
``module.batch`` and ``ParallelExecutor`` (which copy those overrides), async tasks,
the per-attempt copies that ``dspy.Refine``/``dspy.BestOfN`` make, and concurrent runs
never see each other's control.

Replay is keyed by (predictor, inputs, occurrence), not by position, so it survives
threads inside the program: a call of a predictor that ran before the hinted one gets
back a copy of the ``Prediction`` it returned, taken at call time (types intact) or, after a
resume, one rebuilt from the signature's output types; a call that cannot be replayed
runs live and is counted. A call that raised (a parse failure) is a step too, with its error
and no outputs, so its predictor can be hinted and blamed; it is never replayed.

A thread the program starts itself (``concurrent.futures.ThreadPoolExecutor``, ``threading.Thread``)
does not inherit the context: a predictor called there would run outside the run, unrecorded, under
the user's instruction and past the task-LM caps. Such a call makes no LM call; it raises
:class:`CallOutsideRun` and the run stops with an error that names the predictor.

A run may also name a :class:`Reference`: an earlier run of the same example. Calls of
predictors whose instruction and hint are the same in both runs, with the same inputs,
reuse that run's answers instead of calling the LM again; a run whose program output
comes out equal to the reference's takes the reference's score without calling the
metric (it is not a metric call). Under a deterministic LM and metric this is exactly
what the full run would give, at the price of only the calls whose inputs changed.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import dspy
import pydantic
from dspy.signatures.signature import ensure_signature

from ..runtime.budget import TaskCapReached, task_ticket
from ..runtime.jsonable import digest, to_jsonable
from ..runtime.retries import error_kind
from ..runtime.usage import empty_usage, track
from .hint_delivery import hinted_call, instructed
from .program_state import as_examples
from .run_control import CONTROL_KEY, RunControl, call_key, call_setting
from .runs import Step

ERROR_CHARS = 500  # of a failed call's error kept in its step
_NAME_ATTR = "_agentgrad_name"


def rebuild_prediction(signature: type[dspy.Signature], outputs: dict[str, Any]) -> dspy.Prediction:
    """A Prediction from journaled (JSON) outputs, each field validated back to its declared type."""
    values = {}
    for key, value in outputs.items():
        declared = signature.output_fields.get(key)
        annotation = declared.annotation if declared is not None else Any
        values[key] = pydantic.TypeAdapter(annotation).validate_python(value)
    return dspy.Prediction(**values)


def _snapshot(prediction: Any) -> Any:
    """A copy of what a call returned, taken when it returned: the program may edit its outputs afterwards
    (pop from a list, set a field), and a replay must hand back what the predictor said."""
    try:
        return copy.deepcopy(prediction)
    except Exception:  # an output type that cannot be copied: keep the object itself
        return prediction


def _replayed(predictor: dspy.Predict, step: Step) -> dspy.Prediction | None:
    if step.prediction is not None:
        return _snapshot(step.prediction)  # each replay gets its own copy, for the same reason
    try:
        return rebuild_prediction(predictor.signature, step.outputs)
    except (pydantic.ValidationError, TypeError, ValueError):
        return None


class _Call:
    """One intercepted predictor call: replay it, or run it under the run's instructions and hint."""

    def __init__(self, predictor: dspy.Predict, delivery: str, kwargs: dict):
        self.predictor = predictor
        self.name = getattr(predictor, _NAME_ATTR)
        self.control: RunControl = dspy.settings.get(CONTROL_KEY)
        self.inputs = {k: to_jsonable(v) for k, v in kwargs.items() if k in predictor.signature.input_fields}
        self.setting = call_setting(kwargs)
        self.sequence, self.call = self.control.start_call(self.name)
        self.kwargs = kwargs
        self.delivery = delivery

    def replay(self) -> dspy.Prediction | None:
        strict = self.name in self.control.replay_names
        if not strict and self.name not in self.control.reuse_names:
            return None
        step = self.control.take_replay(self.name, self.inputs, self.setting)
        prediction = _replayed(self.predictor, step) if step is not None else None
        if prediction is None:
            if strict:
                self.control.missed_replay()
            return None
        trace = dspy.settings.trace
        if trace is not None:
            trace.append((self.predictor, dict(self.kwargs), prediction))
        return self.finish(prediction)

    def live_kwargs(self) -> dict:
        """The call's own keyword arguments (``config``, ``lm``, ``demos`` kept) under the run's
        instruction, with the hint when this predictor is hinted, and the run's added demonstrations after
        the call's own."""
        kwargs = dict(self.kwargs)
        added = self.control.instructions.demos_of(self.name)
        if added:
            kwargs["demos"] = list(kwargs.get("demos") or self.predictor.demos) + as_examples(added)
        base = ensure_signature(kwargs.pop("signature", self.predictor.signature))
        instruction = self.control.instructions.instruction(self.name)
        hint = self.control.hint_for(self.name, call_key(self.name, self.inputs, self.setting))
        if hint:
            demos = kwargs.get("demos") or self.predictor.demos
            signature, inputs = hinted_call(base, instruction, hint, self.delivery, kwargs, demos)
            return {**inputs, "signature": signature}
        return {**kwargs, "signature": instructed(base, instruction)}

    def failed(self, error: BaseException) -> None:
        """Keep the error, and the call as a step with it (no outputs), so its predictor can be blamed."""
        self.control.predictor_error(error)
        text = f"{error_kind(error)}: {error}"
        text = text if len(text) <= ERROR_CHARS else text[:ERROR_CHARS] + " [...]"
        self.control.record(self.sequence, Step(self.name, self.inputs, {}, self.call, None, self.setting, text))

    def demos(self, kwargs: dict) -> list:
        """The demonstrations the call shows the LM (the call's own, else the predictor's)."""
        return list(kwargs.get("demos") or self.predictor.demos or [])

    def answer_key(self, kwargs: dict) -> str | None:
        """The journal key of the answer to this live call: what the LM is sent (instruction, fields, inputs,
        demonstrations, settings) and the run it belongs to; None without a journal."""
        if self.control.answers is None:
            return None
        signature = kwargs["signature"]
        lm = kwargs.get("lm") or self.predictor.lm
        request = {
            "name": self.name,
            "instructions": signature.instructions,
            "fields": list(signature.fields),
            "kwargs": {k: v for k, v in kwargs.items() if k not in ("signature", "lm", "demos")},
            "demos": self.demos(kwargs),
            "config": getattr(self.predictor, "config", None),
            "lm": None if lm is None else getattr(lm, "model", type(lm).__name__),
        }
        return self.control.answer_key(digest(request))

    def journaled(self, kwargs: dict, key: str | None) -> dspy.Prediction | None:
        """The answer an earlier compile paid for this call, if journaled: its usage counts as this run's, and
        against the task-LM caps, as when it was paid."""
        record = self.control.answers.take(key) if key is not None else None
        if record is None:
            return None
        try:
            prediction = rebuild_prediction(kwargs["signature"], record["outputs"])
        except (pydantic.ValidationError, TypeError, ValueError, KeyError):
            return None
        usage = record.get("usage") or {}
        self.control.add_journaled(usage)
        if self.control.budget is not None:
            self.control.budget.charge_replayed_task(usage)
        trace = dspy.settings.trace
        if trace is not None:
            trace.append((self.predictor, dict(self.kwargs), prediction))
        return prediction

    def keep(self, key: str | None, prediction: Any, usage: dict[str, int]) -> None:
        """Journal the answer just paid for, before the program sees it."""
        if key is not None:
            outputs = to_jsonable(dict(prediction.items())) if hasattr(prediction, "items") else {}
            self.control.answers.keep(key, outputs, usage)

    @contextmanager
    def admitted(self, kwargs: dict) -> Iterator[dict[str, int]]:
        """Hold the call's worst case (its whole prompt, demonstrations included) against the task-LM caps
        while it runs, then settle what it used; yields the call's usage (filled when the call is done)."""
        budget = self.control.budget
        ticket = None
        if budget is not None:
            lm = kwargs.get("lm") or self.predictor.lm or dspy.settings.lm
            inputs = {k: v for k, v in kwargs.items() if k in kwargs["signature"].input_fields}
            try:
                ticket = budget.admit_task_call(task_ticket(lm, kwargs["signature"], inputs, self.demos(kwargs)))
            except TaskCapReached as refused:
                self.control.capped = refused
                raise
        usage = empty_usage()
        try:
            with track() as usage:
                yield usage
        finally:
            if ticket is not None:
                budget.settle_task_call(ticket, usage["calls"], usage["prompt_tokens"] + usage["completion_tokens"])

    def finish(self, prediction: Any) -> Any:
        outputs = to_jsonable(dict(prediction.items())) if hasattr(prediction, "items") else {}
        self.control.record(
            self.sequence, Step(self.name, self.inputs, outputs, self.call, _snapshot(prediction), self.setting)
        )
        return prediction


class CallOutsideRun(RuntimeError):
    """A predictor of the program was called in a thread the run's context did not reach."""


class OutsideCalls:
    """The predictors called outside a run, shared by a program copy's predictors and their deep copies."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.names: list[str] = []

    def __deepcopy__(self, memo: dict) -> OutsideCalls:
        return self  # dspy.Refine's per-attempt copies report to the same runner

    def refuse(self, name: str) -> None:
        """Note the call and refuse it (no LM call is made)."""
        with self._lock:
            self.names.append(name)
        raise CallOutsideRun(_outside_message(name))

    def check(self) -> None:
        """Raise :class:`CallOutsideRun` when a predictor was called outside a run (even if the program caught it)."""
        with self._lock:
            names = list(self.names)
        if names:
            raise CallOutsideRun(_outside_message(names[0]))


def _outside_message(name: str) -> str:
    return (
        f"predictor {name!r} was called in a thread the program started itself (a concurrent.futures."
        "ThreadPoolExecutor or threading.Thread inside forward), which does not inherit DSPy's context: AgentGrad "
        "could neither record, hint nor cap that call. Run it with dspy.Parallel or module.batch, or submit it "
        "with the caller's context: ctx = contextvars.copy_context(); pool.submit(ctx.run, predictor, **inputs)"
    )


def _intercepted_forward(self: dspy.Predict, **kwargs):
    if dspy.settings.get(CONTROL_KEY) is None:
        self._agentgrad_outside.refuse(getattr(self, _NAME_ATTR))
    call = _Call(self, self._agentgrad_delivery, kwargs)
    replayed = call.replay()
    if replayed is not None:
        return replayed
    try:
        live = call.live_kwargs()
        key = call.answer_key(live)
        journaled = call.journaled(live, key)
        if journaled is not None:
            return call.finish(journaled)
        with call.admitted(live) as usage:
            prediction = type(self).forward(self, **live)
        call.keep(key, prediction, usage)
        return call.finish(prediction)
    except Exception as error:
        call.failed(error)
        raise


async def _intercepted_aforward(self: dspy.Predict, **kwargs):
    if dspy.settings.get(CONTROL_KEY) is None:
        self._agentgrad_outside.refuse(getattr(self, _NAME_ATTR))
    call = _Call(self, self._agentgrad_delivery, kwargs)
    replayed = call.replay()
    if replayed is not None:
        return replayed
    try:
        live = call.live_kwargs()
        key = call.answer_key(live)
        journaled = call.journaled(live, key)
        if journaled is not None:
            return call.finish(journaled)
        with call.admitted(live) as usage:
            prediction = await type(self).aforward(self, **live)
        call.keep(key, prediction, usage)
        return call.finish(prediction)
    except Exception as error:
        call.failed(error)
        raise


def intercept(predictor: dspy.Predict, name: str, delivery: str, outside: OutsideCalls) -> None:
    """Route the predictor's calls through the run control; a call outside any run is noted in ``outside``.

    The hooks are bound methods of the predictor itself, so a ``deepcopy`` of the
    program (``Refine``/``BestOfN`` copy it per attempt and set that copy's LM) rebinds
    them to the copy and keeps its per-attempt LM settings.
    """
    setattr(predictor, _NAME_ATTR, name)
    predictor._agentgrad_delivery = delivery
    predictor._agentgrad_outside = outside
    predictor.forward = _intercepted_forward.__get__(predictor)
    predictor.aforward = _intercepted_aforward.__get__(predictor)


def released(program: dspy.Module) -> dspy.Module:
    """A copy of an intercepted ``program`` with its predictors' hooks taken off: what pickles (the hooks are
    bound methods that pickle cannot name) and is intercepted again where it is unpickled."""
    copy_ = program.deepcopy()
    for _, predictor in copy_.named_predictors():
        for attr in ("forward", "aforward", _NAME_ATTR, "_agentgrad_delivery", "_agentgrad_outside"):
            predictor.__dict__.pop(attr, None)
    return copy_
