"""How a hint reaches a predictor's call: as an extra input field, appended to the instruction, or as a
worked example of the call itself (``hint_delivery``)."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable
from typing import Any

import dspy

from .hints import answer_fields

HINT_HEADER = "Hint for this example only (use it to produce a correct output):"
HINT_FIELD = "example_hint"  # not dspy.Refine's "hint_": Refine overwrites that one with its own advice
HINT_FIELD_DESC = "a hint for this example only: use it to produce a correct output"
HINT_DELIVERIES = ("input_field", "instruction", "demo")


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
