"""The interception of the predictors of the optimizer's private copy of the program: each call runs
under the run's instructions and hint, or is replayed from an earlier call.

The optimizer never edits the user's program: it works on a private copy whose
predictors are intercepted once. Everything that differs between runs (the
instructions, the hints, the calls to replay, the record of calls) travels in a
:class:`RunControl` carried in DSPy's own settings overrides (``dspy.context``), so it
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
import functools
import json
import threading
from collections import defaultdict
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import dspy
import pydantic
from dspy.signatures.signature import ensure_signature

from ..runtime.budget import Budget, TaskCapReached, task_ticket
from ..runtime.jsonable import digest, to_jsonable
from ..runtime.paid_work import AnswerJournal
from ..runtime.retries import error_kind
from ..runtime.usage import empty_usage, track
from .hints import answer_fields
from .program_state import ProgramState, as_examples
from .runs import Step

HINT_HEADER = "Hint for this example only (use it to produce a correct output):"
HINT_FIELD = "example_hint"  # not dspy.Refine's "hint_": Refine overwrites that one with its own advice
HINT_FIELD_DESC = "a hint for this example only: use it to produce a correct output"
HINT_DELIVERIES = ("input_field", "instruction", "demo")
ERROR_CHARS = 500  # of a failed call's error kept in its step
CONTROL_KEY = "agentgrad_run"
_NAME_ATTR = "_agentgrad_name"


def call_key(name: str, inputs: dict[str, Any], setting: str = "") -> str:
    """What tells a predictor's calls apart within a run: its inputs and call setting (replay, per-call hints)."""
    return f"{name}:{digest(inputs)}:{setting}"


#: Per-call arguments of ``Predict.forward`` that change its answer besides the inputs and the instruction.
CALL_SETTINGS = ("demos", "config", "lm")


def call_setting(kwargs: dict[str, Any]) -> str:
    """A digest of the call's own ``demos``, ``config`` and ``lm`` ("" when it passed none): two calls with the
    same inputs but other demos or settings are other calls, for replay and reuse alike."""
    given = {k: kwargs[k] for k in CALL_SETTINGS if kwargs.get(k) is not None}
    if "lm" in given:
        given["lm"] = getattr(given["lm"], "model", None) or type(given["lm"]).__name__
    return digest(given) if given else ""


class RunControl:
    """Per-run state shared by every thread the run uses; all mutation under one lock."""

    def __init__(
        self,
        instructions: ProgramState,
        hints: dict[str, str] | None = None,
        replay: Iterable[Step] = (),
        reuse: Iterable[Step] = (),
        budget: Budget | None = None,
        only: dict[str, str] | None = None,
        answers: AnswerJournal | None = None,
        run: str = "",
    ):
        """``instructions``: the program to run (instructions and added demonstrations); ``replay``: calls that
        must be replayed (a miss is counted); ``reuse``: calls that may be; ``budget``: the task-LM caps every
        live call is admitted against (None: no cap); ``only``: for a hinted predictor, the :func:`call_key` of
        the calls that get its hint (its other calls get none); ``answers``: where each answer is journaled as
        it arrives, under ``run`` (what determines this run), and found again after a resume."""
        self.instructions = instructions
        self.budget = budget
        self.answers = answers
        self.run = run
        self._occurrences: dict[str, int] = defaultdict(int)
        self.journaled_usage = empty_usage()  # of the answers read back from the journal
        self.capped: TaskCapReached | None = None  # a call was refused: the run must not be scored
        self.hints = dict(hints or {})
        self.only = dict(only or {})
        replay, reuse = [s for s in replay if not s.error], [s for s in reuse if not s.error]  # a failure runs anew
        self._lock = threading.Lock()
        self._replay: dict[str, list[Step]] = defaultdict(list)
        for step in replay + reuse:
            self._replay[call_key(step.name, step.inputs, step.setting)].append(step)
        self.replay_names = frozenset(step.name for step in replay)
        self.reuse_names = frozenset(step.name for step in reuse)
        self._next_call: dict[str, int] = defaultdict(int)
        self._sequence = 0
        self._recorded: list[tuple[int, Step]] = []
        self.replay_misses = 0
        self.predictor_errors: list[BaseException] = []

    def hint_for(self, name: str, key: str) -> str | None:
        """The hint of the call of ``name`` whose :func:`call_key` is ``key`` (None: the call gets none)."""
        if name in self.only and self.only[name] != key:
            return None
        return self.hints.get(name)

    def start_call(self, name: str) -> tuple[int, int]:
        """A run-wide sequence number and this predictor's call number."""
        with self._lock:
            sequence, call = self._sequence, self._next_call[name]
            self._sequence += 1
            self._next_call[name] += 1
        return sequence, call

    def answer_key(self, request: str) -> str:
        """The journal key of this run's next call of ``request`` (equal requests in a run are told apart by
        their order)."""
        with self._lock:
            occurrence = self._occurrences[request]
            self._occurrences[request] += 1
        return f"{self.run}:{request}:{occurrence}"

    def add_journaled(self, usage: dict[str, int]) -> None:
        """Count the usage of an answer read back from the journal as this run's (it was paid, earlier)."""
        with self._lock:
            for name in self.journaled_usage:
                number = usage.get(name, 0)
                self.journaled_usage[name] += int(number) if isinstance(number, (int, float)) else 0

    def take_replay(self, name: str, inputs: dict[str, Any], setting: str = "") -> Step | None:
        """The recorded call to hand back for this predictor, inputs and call setting, if one is left."""
        with self._lock:
            queue = self._replay.get(call_key(name, inputs, setting))
            return queue.pop(0) if queue else None

    def record(self, sequence: int, step: Step) -> None:
        """Keep a finished call, by its start order (threads may finish out of order)."""
        with self._lock:
            self._recorded.append((sequence, step))

    def missed_replay(self) -> None:
        """Count a call that should have been replayed but ran live (reported per run)."""
        with self._lock:
            self.replay_misses += 1

    def predictor_error(self, error: BaseException) -> None:
        """Keep an error a predictor raised, to tell the program's own bugs from LM errors."""
        with self._lock:
            self.predictor_errors.append(error)

    def steps(self) -> list[Step]:
        """The run's calls in start order."""
        with self._lock:
            return [step for _, step in sorted(self._recorded, key=lambda pair: pair[0])]


def hinted_instruction(instruction: str, hint: str) -> str:
    """An instruction with the hint appended (``hint_delivery='instruction'``)."""
    return f"{instruction}\n\n{HINT_HEADER}\n{hint}"


@functools.lru_cache(maxsize=4096)
def instructed(signature: type[dspy.Signature], instruction: str, hint_field: bool = False) -> type[dspy.Signature]:
    """``signature`` under ``instruction`` (plus the hint input field), built once per pair.

    Building a signature class is a pydantic model construction; doing it on every predictor
    call cost more CPU than the rest of the orchestration together.
    """
    built = signature.with_instructions(instruction)
    if hint_field and HINT_FIELD not in built.input_fields:
        built = built.append(HINT_FIELD, dspy.InputField(desc=HINT_FIELD_DESC), str)
    return built


def hint_outputs(signature: type[dspy.Signature], hint: str) -> dict[str, Any] | None:
    """What a ``demo``-delivered hint says the step writes: a JSON object of the step's output fields, or the
    text itself when the step has one answer field (reasoning fields aside); None when it says neither."""
    try:
        parsed = json.loads(hint)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and parsed and set(parsed) <= set(signature.output_fields):
        return parsed
    answers = list(answer_fields(signature.output_fields))
    return {answers[0]: hint} if len(answers) == 1 else None


def hinted_call(
    signature: type[dspy.Signature], instruction: str, hint: str, delivery: str, kwargs: dict, demos: Iterable = ()
):
    """The signature and inputs of a hinted call.

    ``input_field`` passes the hint as an extra input field next to the step's inputs (the way
    ``dspy.Refine`` passes its advice, under a name of its own so both reach a predictor inside
    a ``Refine``); ``instruction`` appends it to the instruction; ``demo`` shows it as a worked example of
    this very call, after the step's ``demos``: its inputs, and the hint as its output (:func:`hint_outputs`).
    Small models copy a demonstration far more readily than they follow advice. A hint that names no output
    goes in the input field.
    """
    if delivery == "instruction":
        return signature.with_instructions(hinted_instruction(instruction, hint)), kwargs
    outputs = hint_outputs(signature, hint) if delivery == "demo" else None
    if outputs is not None:
        inputs = {k: v for k, v in kwargs.items() if k in signature.input_fields}
        shown = list(demos) + [dspy.Example(**inputs, **outputs)]
        return instructed(signature, instruction), {**kwargs, "demos": shown}
    return instructed(signature, instruction, hint_field=True), {**kwargs, HINT_FIELD: hint}


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
        instruction = self.control.instructions[self.name]
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
