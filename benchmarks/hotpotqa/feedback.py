"""Feedback per module for HotpotQA, as the GEPA paper's code gives it (our own wording): the answer
module hears the gold answer and the supporting passages; the query writer which supporting documents
each hop found and the full text of those still missing; the summarizers the summary that would have
served (the supporting sentences). The same text reaches GEPA's reflection (``pred_name``) and
AgentGrad's hints."""

from __future__ import annotations

from benchmarks.common import normalize_answer, normalize_title


def gold_titles(example) -> list[str]:
    return list(dict.fromkeys(example.get("gold_titles") or []))


def _passage(example, title: str) -> str:
    sentences = (example.get("gold_context") or {}).get(title)
    return f"{title} | {''.join(sentences).strip()}" if sentences else title


def ideal_summary(example) -> str:
    """The supporting sentences, one per line (``title | sentence``); titles alone when the example has
    no sentences (online data without details)."""
    context = example.get("gold_context") or {}
    lines = []
    for title, sent_id in example.get("supporting_facts") or []:
        sentences = context.get(title) or []
        if 0 <= int(sent_id) < len(sentences):
            lines.append(f"{title} | {sentences[int(sent_id)].strip()}")
    return "\n".join(lines) if lines else ", ".join(gold_titles(example))


def retrieval_state(example, pred) -> dict[str, list[str]]:
    """Gold titles found by hop 1, found only by hop 2, and missing after both."""
    hop1 = {normalize_title(t) for t in (pred.get("hop1_titles") or [])}
    both = hop1 | {normalize_title(t) for t in (pred.get("hop2_titles") or [])}
    titles = gold_titles(example)
    return {
        "hop1": [t for t in titles if normalize_title(t) in hop1],
        "hop2_new": [t for t in titles if normalize_title(t) in both and normalize_title(t) not in hop1],
        "missing": [t for t in titles if normalize_title(t) not in both],
        "missing_after_hop1": [t for t in titles if normalize_title(t) not in hop1],
    }


def answer_correct(example, pred) -> bool:
    gold = normalize_answer(str(example.get("answer") or ""))
    return bool(gold) and normalize_answer(str(pred.get("answer") or "")) == gold


def _names(titles: list[str]) -> str:
    return ", ".join(titles) if titles else "none"


def final_answer_feedback(example, pred) -> str:
    context = "\n".join(_passage(example, t) for t in gold_titles(example))
    if answer_correct(example, pred):
        return f"The answer '{pred.get('answer')}' is correct. The passages behind it:\n{context}"
    return (
        f"The answer '{pred.get('answer')}' is wrong; the correct answer is '{example.get('answer')}'. "
        f"The passages from which it can be reasoned:\n{context}"
    )


def query_feedback(example, pred) -> str:
    state = retrieval_state(example, pred)
    missing_text = "\n".join(_passage(example, t) for t in state["missing"])
    return (
        f'You write the query of the second retrieval hop for the question "{example.get("question")}" '
        f"(answer: '{example.get('answer')}'). Hop 1 searched with the question itself.\n"
        f"- Supporting documents hop 1 found: {_names(state['hop1'])}\n"
        f"- Supporting documents hop 1 left to find: {_names(state['missing_after_hop1'])}\n"
        f"- Of those, your query found: {_names(state['hop2_new'])}; still missing: {_names(state['missing'])}\n"
        + (f"The missing documents read:\n{missing_text}\n" if state["missing"] else "")
        + "Aim the query at what links the first hop's findings to the missing documents."
    )


def summary1_feedback(example, pred) -> str:
    state = retrieval_state(example, pred)
    missing_text = "\n".join(_passage(example, t) for t in state["missing_after_hop1"])
    return (
        f'You summarize the first hop\'s passages for the question "{example.get("question")}"; the next '
        "step writes the second query from your summary, and the answer is written from the summaries alone.\n"
        f"- Supporting documents among your passages: {_names(state['hop1'])}\n"
        f"- Supporting documents not yet retrieved: {_names(state['missing_after_hop1'])}\n"
        f"A summary that serves this question holds:\n{ideal_summary(example)}\n"
        + (f"Clues toward the missing documents matter; they read:\n{missing_text}\n" if missing_text else "")
        + "Keep the facts and the bridging entities, not just a compression of the passages."
    )


def summary2_feedback(example, pred) -> str:
    verdict = "correct" if answer_correct(example, pred) else "wrong"
    return (
        f'You write the second summary for the question "{example.get("question")}" from the first summary '
        "and the second hop's passages; the answer module sees only the summaries. The final answer was "
        f"{verdict}; the correct answer is '{example.get('answer')}'. A summary that serves this question holds:\n"
        f"{ideal_summary(example)}\nFill gaps from the first summary and the passages, and keep every "
        "connection the answer needs."
    )


MODULE_FEEDBACK = {
    "final_answer": final_answer_feedback,
    "create_query_hop2": query_feedback,
    "summarize1": summary1_feedback,
    "summarize2": summary2_feedback,
}


def module_feedback(example, pred, pred_name: str | None) -> str | None:
    """Feedback for the module ``pred_name`` names (``summarize1.predict`` or ``summarize1``); None for
    any other name."""
    builder = MODULE_FEEDBACK.get((pred_name or "").split(".")[0])
    return None if builder is None or pred is None else builder(example, pred)
