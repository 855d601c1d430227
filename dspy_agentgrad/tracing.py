"""Running the program on one example, with a recorded trace, a hint for one predictor,
and replay of the predictors that ran before it.

The optimizer never edits the user's program: it works on a private copy whose
predictors are intercepted once. Everything that differs between runs (the
instructions, the hinted predictor, the outputs to replay) travels in a
``contextvars`` value set inside the worker thread, so concurrent runs never see
each other's hint or instructions.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import dspy

from .jsonable import to_jsonable
from .metric import Metric, check_score_range
from .retries import RetryPolicy, error_kind, is_transient
from .usage import empty_usage, track

HINT_HEADER = "Hint for this example only (use it to produce a correct output):"
HINT_FIELD = "hint_"
HINT_FIELD_DESC = "a hint for this example only: use it to produce a correct output"
HINT_DELIVERIES = ("input_field", "instruction")


@dataclass
class Step:
    """One predictor call: which predictor, what it was given, what it returned."""

    name: str
    inputs: dict[str, Any]
    outputs: dict[str, Any]

    def to_dict(self) -> dict:
        return {"name": self.name, "inputs": self.inputs, "outputs": self.outputs}


@dataclass
class Outcome:
    """The result of one scored program run (one metric call)."""

    score: float
    feedback: str = ""
    error: str | None = None
    steps: list[Step] = field(default_factory=list)
    outputs: dict[str, Any] = field(default_factory=dict)
    usage: dict[str, int] = field(default_factory=empty_usage)
    attempts: int = 1

    def order(self) -> list[str]:
        """Predictor names in order of first call in this run."""
        seen: list[str] = []
        for step in self.steps:
            if step.name not in seen:
                seen.append(step.name)
        return seen

    def first_step(self, name: str) -> Step | None:
        return next((s for s in self.steps if s.name == name), None)

    def to_dict(self) -> dict:
        return {
            "score": self.score,
            "feedback": self.feedback,
            "error": self.error,
            "steps": [s.to_dict() for s in self.steps],
            "outputs": self.outputs,
            "usage": self.usage,
            "attempts": self.attempts,
        }

    @classmethod
    def from_dict(cls, data: dict) -> Outcome:
        return cls(
            score=data["score"],
            feedback=data.get("feedback", ""),
            error=data.get("error"),
            steps=[Step(**s) for s in data.get("steps", [])],
            outputs=data.get("outputs", {}),
            usage=data.get("usage", empty_usage()),
            attempts=data.get("attempts", 1),
        )


@dataclass
class _RunControl:
    instructions: dict[str, str]
    hint_target: str | None = None
    hint: str | None = None
    replay: list[Step] = field(default_factory=list)
    replay_until: int = 0
    position: int = 0


_ACTIVE: contextvars.ContextVar[_RunControl | None] = contextvars.ContextVar("agentgrad_run", default=None)


def hinted_instruction(instruction: str, hint: str) -> str:
    return f"{instruction}\n\n{HINT_HEADER}\n{hint}"


def hinted_call(signature: type[dspy.Signature], instruction: str, hint: str, delivery: str, kwargs: dict):
    """The signature and inputs of a hinted call.

    ``input_field`` passes the hint as an extra input field next to the step's inputs (as
    ``dspy.Refine`` passes its advice); ``instruction`` appends it to the instruction.
    """
    if delivery == "instruction":
        return signature.with_instructions(hinted_instruction(instruction, hint)), kwargs
    hinted = signature.with_instructions(instruction).append(HINT_FIELD, dspy.InputField(desc=HINT_FIELD_DESC), str)
    return hinted, {**kwargs, HINT_FIELD: hint}


def _intercept(predictor: dspy.Predict, name: str, original: Callable, delivery: str) -> Callable:
    def forward(**kwargs):
        control = _ACTIVE.get()
        if control is None:
            return original(**kwargs)
        position = control.position
        control.position += 1
        if position < control.replay_until and control.replay[position].name == name:
            prediction = dspy.Prediction(**control.replay[position].outputs)
            trace = dspy.settings.trace
            if trace is not None:
                trace.append((predictor, dict(kwargs), prediction))
            return prediction
        instruction = control.instructions[name]
        if name == control.hint_target and control.hint:
            signature, inputs = hinted_call(predictor.signature, instruction, control.hint, delivery, kwargs)
            return original(signature=signature, **inputs)
        return original(signature=predictor.signature.with_instructions(instruction), **kwargs)

    return forward


class ProgramRunner:
    """Runs a private copy of the user's program under chosen instructions.

    Program errors (LM failures, parse failures) are retried when transient and
    otherwise scored as a failure (score 0) with the error recorded; they never
    count as a success.
    """

    def __init__(
        self,
        student: dspy.Module,
        metric: Metric,
        task_model: Any = None,
        retry: RetryPolicy | None = None,
        hint_delivery: str = "input_field",
        max_score: float | None = None,
    ):
        self.program = student.deepcopy()
        self.max_score = max_score
        self.metric = metric
        self.task_model = task_model
        self.retry = retry or RetryPolicy()
        self.names: dict[int, str] = {}
        for name, predictor in self.program.named_predictors():
            self.names[id(predictor)] = name
            original = type(predictor).forward.__get__(predictor)  # not via getattr: DSPy warns on that
            predictor.forward = _intercept(predictor, name, original, hint_delivery)

    def run(
        self,
        example: dspy.Example,
        instructions: dict[str, str],
        *,
        hint_target: str | None = None,
        hint: str | None = None,
        replay: list[Step] | None = None,
        replay_until: int = 0,
    ) -> Outcome:
        attempt = 0
        total_usage = empty_usage()
        while True:
            attempt += 1
            control = _RunControl(dict(instructions), hint_target, hint, list(replay or []), replay_until)
            trace: list = []
            token = _ACTIVE.set(control)
            try:
                with (
                    track() as usage,
                    dspy.context(trace=trace, **({"lm": self.task_model} if self.task_model else {})),
                ):
                    prediction = self.program(**example.inputs())
                error = None
            except Exception as exc:  # LM errors, parse failures: scored as failure, never as success
                prediction, error = None, exc
            finally:
                _ACTIVE.reset(token)
            for key in total_usage:
                total_usage[key] += usage[key]
            if error is not None and is_transient(error) and attempt < self.retry.attempts:
                self.retry.wait(attempt, error)
                continue
            steps = [
                Step(self.names.get(id(p), type(p).__name__), to_jsonable(inputs), to_jsonable(dict(pred.items())))
                for p, inputs, pred in trace
            ]
            if error is not None:
                return Outcome(
                    0.0,
                    f"The program failed: {error_kind(error)}: {error}",
                    error_kind(error),
                    steps,
                    {},
                    total_usage,
                    attempt,
                )
            result = self.metric(example, prediction)
            if self.max_score is not None:
                check_score_range(result.score, self.max_score, example)
            outputs = (
                to_jsonable(dict(prediction.items()))
                if hasattr(prediction, "items")
                else {"output": to_jsonable(prediction)}
            )
            return Outcome(result.score, result.feedback, None, steps, outputs, total_usage, attempt)
