"""Hints for sequential intervention, and the guard against label leakage.

The default hint tells the targeted predictor which outputs it produces and what a
correct run of the whole program ends with: the example's label fields (not its
metadata such as ids or difficulty tags) and the metric's feedback.

The trap: a hint that hands a predictor the gold answer lets *any* predictor (the
last one above all) copy it, so every failure would look like the last predictor's
fault. The guard (``leaks_label``) looks only at the values the hint revealed, and
only in the predictor's answer fields (not its reasoning): a fix whose answer holds a
revealed value that the predictor's own inputs do not contain is a *leaking* fix.
It is not thrown away: the failure moves on to earlier predictors, and the leaking
fix is attributed only when none of them fixes the failure (so a single-predictor
classifier, whose label is never in its inputs, is still blamed). Very short values
(yes/no, digits, three characters or fewer) cannot be checked this way and are exempt.
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import dspy

from ..runtime.jsonable import to_jsonable

REASONING_MARKERS = ("reason", "rationale", "thought")


@dataclass(frozen=True)
class Hint:
    """A hint's text and the label values it reveals (what the leak guard checks).

    A ``hint_fn`` may return a plain string instead: the guard then takes as revealed
    every label value of the example that occurs in the text.
    """

    text: str
    reveals: tuple[Any, ...] = ()


def _label_values(example: dspy.Example, prediction: Any, label_fields: Iterable[str] | None) -> dict[str, Any]:
    """The labels a correct run must reproduce: ``label_fields`` when named, else the example's labels
    that the program outputs under the same name, else all of its labels."""
    labels = {k: to_jsonable(v) for k, v in example.labels().items()}
    if label_fields is not None:
        return {k: labels[k] for k in label_fields if k in labels}
    produced = set(prediction.keys()) if hasattr(prediction, "keys") else set()
    return {k: v for k, v in labels.items() if k in produced} or labels


def default_hint(
    example: dspy.Example,
    pred_name: str,
    prediction: Any,
    feedback: str,
    *,
    label_fields: Iterable[str] | None = None,
    output_fields: dict[str, list[str]] | None = None,
) -> Hint | None:
    """What a correct run needs, for the predictor ``pred_name``; ``None`` when there is nothing to say."""
    labels = _label_values(example, prediction, label_fields)
    parts = []
    if labels:
        shown = "; ".join(f"{k} = {v}" for k, v in labels.items())
        parts.append(f"A correct run of the whole program ends with: {shown}.")
    if feedback:
        parts.append(f"Feedback on the failed run: {feedback}")
    if not parts:
        return None
    fields = (output_fields or {}).get(pred_name)
    yours = f"your own outputs ({', '.join(fields)})" if fields else "your own outputs"
    parts.append(
        f"You are one step of that program: produce {yours} so that the program reaches this result, "
        "using the information in your inputs."
    )
    return Hint(" ".join(parts), tuple(labels.values()))


def _normalize(text: str) -> str:
    text = text.lower()
    text = "".join(ch if ch not in string.punctuation else " " for ch in text)
    return re.sub(r"\s+", " ", text).strip()


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple, set)):
        return [s for v in value for s in _strings(v)]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    return []


def _checkable(label: str) -> bool:
    norm = _normalize(label)
    return len(norm) > 3 and not norm.replace(" ", "").isdigit() and norm not in {"true", "false", "none"}


def as_hint(example: dspy.Example, value: Hint | str | None) -> Hint | None:
    """A ``hint_fn`` result as a :class:`Hint`; for plain text, the revealed values are the labels it mentions."""
    if value is None or isinstance(value, Hint):
        return value if value is None or value.text else None
    if not isinstance(value, str):
        raise TypeError(f"hint_fn must return a str, a Hint or None; it returned {type(value).__name__}")
    if not value:
        return None
    text = f" {_normalize(value)} "
    labels = [v for v in _strings(to_jsonable(dict(example.labels()))) if f" {_normalize(v)} " in text]
    return Hint(value, tuple(labels))


def answer_fields(outputs: dict[str, Any]) -> dict[str, Any]:
    """The output fields that carry the predictor's answer (not its reasoning)."""
    return {k: v for k, v in outputs.items() if not any(m in k.lower() for m in REASONING_MARKERS)}


def leaks_label(hint: Hint, step_inputs: dict, corrected_outputs: dict) -> bool:
    """True when a corrected answer field holds a value the hint revealed that the step's inputs do not hold."""
    inputs_text = " " + _normalize(" ".join(str(to_jsonable(v)) for v in step_inputs.values())) + " "
    answers = answer_fields(corrected_outputs)
    output_text = " " + _normalize(" ".join(str(to_jsonable(v)) for v in answers.values())) + " "
    for label in _strings(to_jsonable(list(hint.reveals))):
        if not _checkable(label):
            continue
        norm = f" {_normalize(label)} "
        if norm in output_text and norm not in inputs_text:
            return True
    return False
