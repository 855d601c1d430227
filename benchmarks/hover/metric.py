"""HoVer metric (every gold supporting title retrieved, with feedback) and AgentGrad hint."""

from __future__ import annotations

import dspy

from benchmarks.common import doc_title, normalize_title
from benchmarks.hover.feedback import module_feedback


def _retrieved_titles(pred) -> list[str]:
    if pred is None:
        return []
    titles = pred.get("retrieved_titles")
    if titles is None:
        titles = [doc_title(d) for d in (pred.get("retrieved_docs") or [])]
    return list(titles)


def found_and_missing(gold, pred) -> tuple[list[str], list[str]]:
    seen = {normalize_title(t) for t in _retrieved_titles(pred)}
    titles = list(dict.fromkeys(gold.titles))
    return [t for t in titles if normalize_title(t) in seen], [t for t in titles if normalize_title(t) not in seen]


def discrete_retrieval(gold, pred, trace=None, pred_name=None, pred_trace=None) -> dspy.Prediction:
    """1.0 when every gold supporting title is among the retrieved titles, else 0.0. For a named predictor
    (GEPA's ``pred_name``) the feedback adds that module's own (:mod:`benchmarks.hover.feedback`)."""
    found, missing = found_and_missing(gold, pred)
    score = float(not missing)
    if score == 1.0:
        feedback = f"All {len(found)} supporting documents were retrieved: {', '.join(found)}."
    else:
        feedback = (
            f"Retrieved {len(found)} of {len(found) + len(missing)} supporting documents. "
            f"Found: {', '.join(found) if found else 'none'}. Missing: {', '.join(missing)}."
        )
    if pred is not None and pred_name is not None and pred.get("hop_titles"):
        hops = "; ".join(f"hop {i + 1}: {', '.join(h)}" for i, h in enumerate(pred.hop_titles))
        feedback += f" Retrieved titles by hop -- {hops}."
    per_module = module_feedback(gold, pred, pred_name)
    if per_module is not None:
        feedback += "\n" + per_module
    return dspy.Prediction(score=score, feedback=feedback)


def hint(example, pred_name, prediction, feedback) -> str | None:
    """The gold titles still missing from the retrieval, phrased for predictor ``pred_name``, followed by
    the same per-module feedback GEPA's reflection reads."""
    found, missing = found_and_missing(example, prediction)
    if not missing:
        return None
    names = ", ".join(missing)
    name = (pred_name or "").lower()
    if "create_query" in name:
        target = f"The query must retrieve the Wikipedia article(s) titled: {names}."
    elif "summarize" in name:
        target = f"The summary must name the entities that lead to the still-missing article(s): {names}."
    else:
        target = f"Still missing supporting articles: {names}."
    per_module = module_feedback(example, prediction, pred_name)
    return target if per_module is None else f"{target}\n{per_module}"
