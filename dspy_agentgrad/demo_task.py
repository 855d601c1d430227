"""The demo task AgentGrad optimizes with the embedded local LM: constrained writing.

IFEval prompts (``/work/shared/data/ifeval/input_data.jsonl``, Apache-2.0) ask
for a piece of writing under verifiable constraints ("all lowercase", "no
commas", "end with 'Is there anything else I can help with?'", "wrap the
answer in double quotes"...). We keep the prompts whose constraints are all in a
small set checked here in a few lines each, and whose length constraints fit the
local LM's bounded outputs. A 135M/270M model satisfies some constraints and
ignores others, and a sharper instruction ("check every constraint; if asked for
lowercase write no capital letter at all") can help it: a task where prompt
optimization has room to act.

The program has two predictors, ``draft`` (writes) then ``revise`` (rewrites the
draft to obey the constraints), so a failure can be attributed to either: the
hint tells a predictor exactly which constraints the response must still meet.

The score is the fraction of the example's constraints satisfied (IFEval's
"loose" per-instruction accuracy, simplified); feedback names the violated ones.
"""

from __future__ import annotations

import json
import os
import random
import re
from pathlib import Path
from typing import Any, Callable

import dspy

__all__ = ["load_demo_data", "make_program", "metric", "hint", "check", "SUPPORTED", "DATA_PATH", "demo_lm"]

DATA_PATH = Path(os.environ.get("AGENTGRAD_IFEVAL_PATH", "/work/shared/data/ifeval/input_data.jsonl"))


# ---------------------------------------------------------------- constraint checkers


def _words(text: str) -> list[str]:
    return re.findall(r"\b\w+\b", text)


def _sentences(text: str) -> list[str]:
    return [s for s in re.split(r"(?<=[.!?])\s+", text.strip()) if s.strip()]


def _relation(count: int, relation: str, n: int) -> bool:
    return count < n if relation == "less than" else count >= n


def _has_word(text: str, word: str) -> bool:
    return re.search(r"\b" + re.escape(word) + r"\b", text, flags=re.I) is not None


# id -> (check(response, kwargs) -> bool, describe(kwargs) -> str)
SUPPORTED: dict[str, tuple[Callable[[str, dict], bool], Callable[[dict], str]]] = {
    "punctuation:no_comma": (lambda r, k: "," not in r, lambda k: "contain no commas at all"),
    "change_case:english_lowercase": (
        lambda r, k: r == r.lower() and any(c.isalpha() for c in r),
        lambda k: "be written entirely in lowercase letters (no capital letter anywhere)"),
    "change_case:english_capital": (
        lambda r, k: r == r.upper() and any(c.isalpha() for c in r),
        lambda k: "be written entirely in CAPITAL LETTERS"),
    "keywords:existence": (
        lambda r, k: all(_has_word(r, w) for w in k["keywords"]),
        lambda k: "include the words " + ", ".join(repr(w) for w in k["keywords"])),
    "keywords:forbidden_words": (
        lambda r, k: not any(_has_word(r, w) for w in k["forbidden_words"]),
        lambda k: "never use the words " + ", ".join(repr(w) for w in k["forbidden_words"])),
    "startend:end_checker": (
        lambda r, k: r.strip().lower().rstrip('"').strip().endswith(k["end_phrase"].strip().lower()),
        lambda k: f"end with the exact phrase {k['end_phrase']!r} and nothing after it"),
    "startend:quotation": (
        lambda r, k: len(r.strip()) > 1 and r.strip()[0] == '"' and r.strip()[-1] == '"',
        lambda k: 'be wrapped in double quotation marks (start with " and end with ")'),
    "detectable_format:title": (
        lambda r, k: re.search(r"<<[^\n]+>>", r) is not None,
        lambda k: "contain a title wrapped in double angular brackets, like <<my title>>"),
    "detectable_content:postscript": (
        lambda r, k: re.search(r"\s*" + re.escape(k["postscript_marker"].lower()) + r".*", r.lower(), flags=re.S)
        is not None,
        lambda k: f"end with a postscript starting with {k['postscript_marker']}"),
    "length_constraints:number_words": (
        lambda r, k: _relation(len(_words(r)), k["relation"], k["num_words"]),
        lambda k: f"have {k['relation']} {k['num_words']} words"),
    "length_constraints:number_sentences": (
        lambda r, k: _relation(len(_sentences(r)), k["relation"], k["num_sentences"]),
        lambda k: f"have {k['relation']} {k['num_sentences']} sentences"),
}


def _fits_local_lm(instruction_id: str, kwargs: dict) -> bool:
    """Length constraints a bounded (~100-word) local reply can meet, nothing trivial to skip."""
    if instruction_id == "length_constraints:number_words":
        return kwargs["num_words"] <= 80 if kwargs["relation"] != "less than" else kwargs["num_words"] >= 10
    if instruction_id == "length_constraints:number_sentences":
        return kwargs["num_sentences"] <= 5 if kwargs["relation"] != "less than" else kwargs["num_sentences"] >= 2
    return True


def check(response: str, instruction_ids: list[str], kwargs_list: list[dict]) -> list[tuple[str, bool, str]]:
    """(instruction id, satisfied, description) for each constraint of an example."""
    results = []
    for iid, kw in zip(instruction_ids, kwargs_list):
        ok, describe = SUPPORTED[iid]
        results.append((iid, bool(ok(response or "", kw)), describe(kw)))
    return results


# ---------------------------------------------------------------- data


def _clean_kwargs(kwargs: dict) -> dict:
    return {k: v for k, v in kwargs.items() if v is not None}


def load_demo_data(n_train: int = 30, n_val: int = 20, n_test: int = 40, seed: int = 0,
                   path: str | Path | None = None) -> tuple[list[dspy.Example], list[dspy.Example], list[dspy.Example]]:
    """Disjoint train/val/test lists of ``dspy.Example(prompt=...)`` (inputs: ``prompt``).

    Labels: ``instruction_id_list`` and ``kwargs`` (the constraints), ``key``.
    Only prompts whose every constraint is in :data:`SUPPORTED` (and fits a short
    reply) are kept: 175 of IFEval's 541. The split is a seeded shuffle.
    """
    rows = [json.loads(line) for line in Path(path or DATA_PATH).read_text().splitlines() if line.strip()]
    kept = []
    for row in rows:
        ids, kws = row["instruction_id_list"], [_clean_kwargs(k) for k in row["kwargs"]]
        if ids and all(i in SUPPORTED and _fits_local_lm(i, k) for i, k in zip(ids, kws)):
            kept.append(dspy.Example(prompt=row["prompt"], instruction_id_list=ids, kwargs=kws,
                                     key=row["key"]).with_inputs("prompt"))
    kept.sort(key=lambda e: e.key)
    random.Random(seed).shuffle(kept)
    need = n_train + n_val + n_test
    if need > len(kept):
        raise ValueError(f"asked for {need} examples, only {len(kept)} usable")
    return kept[:n_train], kept[n_train:n_train + n_val], kept[n_train + n_val:need]


# ---------------------------------------------------------------- program


class Draft(dspy.Signature):
    """Write a response to the user's request."""

    prompt: str = dspy.InputField(desc="the user's request, including constraints on the response")
    response: str = dspy.OutputField(desc="the response")


class Revise(dspy.Signature):
    """Rewrite the draft so that it follows every constraint in the request."""

    prompt: str = dspy.InputField(desc="the user's request, including constraints on the response")
    draft: str = dspy.InputField(desc="a first draft of the response")
    response: str = dspy.OutputField(desc="the final response")


class DraftThenRevise(dspy.Module):
    """Two predictors in sequence: ``draft`` writes, ``revise`` enforces the constraints."""

    def __init__(self) -> None:
        super().__init__()
        self.draft = dspy.Predict(Draft)
        self.revise = dspy.Predict(Revise)

    def forward(self, prompt: str) -> dspy.Prediction:
        draft = self.draft(prompt=prompt).response
        final = self.revise(prompt=prompt, draft=draft).response
        return dspy.Prediction(draft=draft, response=final)


def make_program() -> dspy.Module:
    """A fresh, unoptimized draft-then-revise program."""
    return DraftThenRevise()


def demo_lm(**settings: Any) -> dspy.LM:
    """The local LM as the demo uses it: str fields capped at 500 characters (~80 words) to keep runs short."""
    from dspy_agentgrad.local_lm import local_lm
    from dspy_agentgrad.structured_output import OutputLimits

    settings.setdefault("limits", OutputLimits(str_chars=500))
    return local_lm(**settings)


# ---------------------------------------------------------------- metric and hint


def metric(example: dspy.Example, pred: Any, trace: Any = None, pred_name: str | None = None,
           pred_trace: Any = None) -> dspy.Prediction:
    """Fraction of the example's constraints the final response meets, with feedback.

    With ``pred_name`` (GEPA's per-predictor protocol) the score is the same,
    system-level one: both predictors answer for the final response.
    """
    response = getattr(pred, "response", None) or ""
    results = check(response, example.instruction_id_list, example.kwargs)
    score = sum(ok for _, ok, _ in results) / len(results)
    failed = [desc for _, ok, desc in results if not ok]
    if failed:
        feedback = "The response violates these constraints: it must " + "; it must ".join(failed) + "."
    else:
        feedback = "The response meets every constraint."
    return dspy.Prediction(score=score, feedback=feedback)


def hint(example: dspy.Example, pred_name: str, prediction: Any, feedback: str | None) -> str | None:
    """What ``pred_name`` must do for this example: the constraints still violated, stated plainly.

    Returns None when nothing is violated. The hint names the constraints (the
    labels), not a finished answer, so the corrected output is the model's own.
    """
    response = getattr(prediction, "response", None) or ""
    failed = [desc for _, ok, desc in check(response, example.instruction_id_list, example.kwargs) if not ok]
    if not failed:
        return None
    rules = "\n".join(f"- The response must {d}." for d in failed)
    if pred_name == "draft":
        return f"Before writing, note these hard requirements and follow them exactly:\n{rules}"
    return f"Your rewrite must fix the draft so that:\n{rules}\nChange whatever is needed; keep the rest."
