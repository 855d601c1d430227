"""Hints for sequential intervention, and the guard against label leakage.

The default hint tells the targeted predictor what a correct run of the whole
program needs: the example's labels and the metric's feedback.

The trap: a hint that hands a predictor the gold answer lets *any* predictor
(the last one above all) copy it, so every failure would look like the last
predictor's fault. The guard (``leaks_label``) accepts a hinted fix only when
every label value that the corrected output contains is *grounded* in that
predictor's own inputs: an answerer whose inputs never mention the gold answer
cannot be blamed for missing it; the failure moves on to an earlier predictor
(e.g. the summarizer that dropped the fact). Very short labels (yes/no, digits,
three characters or fewer) cannot be checked this way and are exempt.
"""

from __future__ import annotations

import re
import string
from typing import Any

import dspy

from .jsonable import to_jsonable


def default_hint(example: dspy.Example, pred_name: str, prediction: Any, feedback: str) -> str | None:
    labels = {k: to_jsonable(v) for k, v in example.labels().items()}
    parts = []
    if labels:
        shown = "; ".join(f"{k} = {v}" for k, v in labels.items())
        parts.append(f"A correct run of the whole program ends with: {shown}.")
    if feedback:
        parts.append(f"Feedback on the failed run: {feedback}")
    if not parts:
        return None
    parts.append(
        "Produce your own outputs so that the program reaches this result, using the information in your inputs."
    )
    return " ".join(parts)


def _normalize(text: str) -> str:
    text = text.lower()
    text = "".join(ch if ch not in string.punctuation else " " for ch in text)
    return re.sub(r"\s+", " ", text).strip()


def _label_strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple, set)):
        return [s for v in value for s in _label_strings(v)]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _label_strings(v)]
    return []


def _checkable(label: str) -> bool:
    norm = _normalize(label)
    return len(norm) > 3 and not norm.replace(" ", "").isdigit() and norm not in {"true", "false", "none"}


def leaks_label(example: dspy.Example, step_inputs: dict, corrected_outputs: dict) -> bool:
    """True when the corrected output contains a label value its inputs do not contain."""
    inputs_text = " " + _normalize(" ".join(str(to_jsonable(v)) for v in step_inputs.values())) + " "
    output_text = " " + _normalize(" ".join(str(to_jsonable(v)) for v in corrected_outputs.values())) + " "
    for label in _label_strings(to_jsonable(dict(example.labels()))):
        if not _checkable(label):
            continue
        norm = f" {_normalize(label)} "
        if norm in output_text and norm not in inputs_text:
            return True
    return False
