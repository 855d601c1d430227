"""IFBench metric (fraction of constraints followed, loose variant, with feedback) and AgentGrad hint."""

from __future__ import annotations

import dspy

from benchmarks.ifbench.verifiers import ConstraintResult, check_constraints


def constraint_results(gold, pred) -> list[ConstraintResult]:
    response = "" if pred is None else str(pred.get("response", "") or "")
    return check_constraints(
        gold.get("suite", "ifbench"), list(gold.instruction_id_list), list(gold.kwargs), gold.query, response
    )


def _line(r: ConstraintResult) -> str:
    text = f"- {r.instruction_id}: {r.description}"
    return text + (f" (verifier error: {r.error})" if r.error else "")


def constraint_fraction(gold, pred, trace=None, pred_name=None, pred_trace=None) -> dspy.Prediction:
    """Fraction of the query's constraints that the final response follows (official verifiers, loose)."""
    results = constraint_results(gold, pred)
    if not results:
        return dspy.Prediction(score=0.0, feedback="The example has no constraints to verify.")
    followed = [r for r in results if r.followed]
    violated = [r for r in results if not r.followed]
    score = len(followed) / len(results)
    parts = [f"The response satisfies {len(followed)} of {len(results)} constraints."]
    if followed:
        parts.append("Followed:\n" + "\n".join(_line(r) for r in followed))
    if violated:
        parts.append("Violated:\n" + "\n".join(_line(r) for r in violated))
    return dspy.Prediction(score=score, feedback="\n".join(parts))


def hint(example, pred_name, prediction, feedback) -> str | None:
    """The constraints the response violated, as the verifiers describe them."""
    violated = [r for r in constraint_results(example, prediction) if not r.followed]
    if not violated:
        return None
    lines = "\n".join(f"- {r.description}" for r in violated)
    return f"The response must also satisfy these constraints, which it currently violates:\n{lines}"
