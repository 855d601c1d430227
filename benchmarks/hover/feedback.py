"""Feedback per module for HoVer, as the GEPA paper's code gives it (our own wording): each summarizer
and query writer hears which supporting documents were still missing before its hop, which of them its
hop (or the hops it feeds) retrieved, and which are still missing. The same text reaches GEPA's
reflection (``pred_name``) and AgentGrad's hints."""

from __future__ import annotations

from benchmarks.common import normalize_title

#: Predictor -> (hop whose retrieval it shapes first, last hop it shapes), hops counted from 1.
MODULE_HOPS = {
    "summarize1": (2, 3),
    "create_query_hop2": (2, 2),
    "summarize2": (3, 3),
    "create_query_hop3": (3, 3),
}


def _missing_after(example, pred, hops: int) -> list[str]:
    """Gold titles not retrieved by the first ``hops`` hops."""
    seen = {normalize_title(t) for hop in (pred.get("hop_titles") or [])[:hops] for t in hop}
    return [t for t in dict.fromkeys(example.titles) if normalize_title(t) not in seen]


def module_feedback(example, pred, pred_name: str | None) -> str | None:
    """Feedback for the summarizer or query writer ``pred_name`` names; None for any other name."""
    name = (pred_name or "").split(".")[0]
    if name not in MODULE_HOPS or pred is None or not pred.get("hop_titles"):
        return None
    first, last = MODULE_HOPS[name]
    before = _missing_after(example, pred, first - 1)
    after = _missing_after(example, pred, last)
    helped = [t for t in before if t not in after]
    role = "queries" if name.startswith("create_query") else "summaries"
    if not after:
        return f"Your {role} led to every supporting document being retrieved."
    what = "query" if role == "queries" else "summary"
    lines = [f"Your {role} serve to retrieve the evidence documents for the claim."]
    if helped:
        lines.append(f"Your {what} helped retrieve: {', '.join(helped)}.")
    lines.append(f"Still missing after your {what}: {', '.join(after)}.")
    lines.append(
        f"Think about how the {what} could connect the claim and the passages seen so far to the missing evidence."
    )
    return "\n".join(lines)
