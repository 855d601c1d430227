"""HotpotQA metric (exact match after answer normalisation, with feedback) and AgentGrad hint."""

from __future__ import annotations

import dspy

from benchmarks.common import normalize_answer, normalize_title
from benchmarks.hotpotqa.feedback import module_feedback


def _titles(example) -> list[str]:
    return list(dict.fromkeys(example.get("gold_titles") or []))


def _retrieval_note(gold, pred) -> str:
    titles = _titles(gold)
    if not titles:
        return ""
    seen = {normalize_title(t) for t in list(pred.get("hop1_titles") or []) + list(pred.get("hop2_titles") or [])}
    found = [t for t in titles if normalize_title(t) in seen]
    missing = [t for t in titles if normalize_title(t) not in seen]
    note = f" Supporting articles: {', '.join(titles)}."
    if found:
        note += f" Retrieved: {', '.join(found)}."
    if missing:
        note += f" Never retrieved: {', '.join(missing)}."
    return note


def answer_exact_match(gold, pred, trace=None, pred_name=None, pred_trace=None) -> dspy.Prediction:
    """1.0 when the normalised answer equals the normalised gold answer, else 0.0.

    Feedback quotes both answers and which supporting articles the hops retrieved or missed; for a named
    predictor (GEPA's ``pred_name``) it is that module's own feedback (:mod:`benchmarks.hotpotqa.feedback`).
    """
    predicted = "" if pred is None else str(pred.get("answer", "") or "")
    gold_answer = str(gold.answer)
    score = float(normalize_answer(predicted) == normalize_answer(gold_answer) and bool(normalize_answer(gold_answer)))
    if score == 1.0:
        feedback = f"Correct: the answer '{predicted}' matches the gold answer '{gold_answer}'."
    else:
        feedback = f"Incorrect: the answer was '{predicted}', the gold answer is '{gold_answer}'."
    per_module = module_feedback(gold, pred, pred_name)
    if per_module is not None:
        feedback = per_module
    elif pred is not None and (pred_name is not None or score < 1.0):
        feedback += _retrieval_note(gold, pred)
    return dspy.Prediction(score=score, feedback=feedback)


def hint(example, pred_name, prediction, feedback) -> str | None:
    """What a correct run needs from predictor ``pred_name`` (the gold answer, the supporting articles),
    followed by the same per-module feedback GEPA's reflection reads."""
    answer = str(example.get("answer", "") or "")
    titles = _titles(example)
    name = (pred_name or "").lower()
    title_text = ", ".join(titles) if titles else "the articles that connect the question's entities"
    if "final_answer" in name:
        target = f"The correct answer is '{answer}'. Answer with exactly this short span, nothing more."
    elif "create_query" in name:
        target = f"The query must find the second supporting article(s): {title_text}. Name the bridge entity."
    elif "summarize" in name:
        target = (
            f"Keep the facts from the supporting articles ({title_text}) that lead to the answer "
            f"'{answer}', including the bridge entity's name."
        )
    elif not answer:
        return None
    else:
        target = f"The correct answer is '{answer}'; the supporting articles are {title_text}."
    per_module = module_feedback(example, prediction, pred_name)
    return target if per_module is None else f"{target}\n{per_module}"
