"""IFBench metric (fraction of constraints followed, loose variant, with feedback) and AgentGrad hint."""

from __future__ import annotations

import dspy

from benchmarks.ifbench.verifiers import ConstraintResult, check_constraints

#: Predictor -> the prediction field holding its own output (the first stage's draft, the final response).
MODULE_OUTPUT = {"respond": "draft", "enforce_constraints": "response"}


def constraint_results(gold, pred, field: str = "response") -> list[ConstraintResult]:
    response = "" if pred is None else str(pred.get(field, "") or "")
    return check_constraints(
        gold.get("suite", "ifbench"), list(gold.instruction_id_list), list(gold.kwargs), gold.query, response
    )


def _line(r: ConstraintResult) -> str:
    text = f"- {r.instruction_id}: {r.description}"
    return text + (f" (verifier error: {r.error})" if r.error else "")


def _report(results: list[ConstraintResult], what: str) -> str:
    followed = [r for r in results if r.followed]
    violated = [r for r in results if not r.followed]
    parts = [f"{what} satisfies {len(followed)} of {len(results)} constraints."]
    if followed:
        parts.append("Followed:\n" + "\n".join(_line(r) for r in followed))
    if violated:
        parts.append("Violated:\n" + "\n".join(_line(r) for r in violated))
    return "\n".join(parts)


def module_feedback(gold, pred, pred_name: str | None) -> str | None:
    """As in the GEPA paper's code: each stage's own output checked against the constraints (the first
    stage's draft as if it were the final response). None for a name that is not a stage."""
    field = MODULE_OUTPUT.get((pred_name or "").split(".")[0])
    if field is None or pred is None or pred.get(field) is None:
        return None
    what = "Your draft response" if field == "draft" else "Your final response"
    return _report(constraint_results(gold, pred, field), what)


def constraint_fraction(gold, pred, trace=None, pred_name=None, pred_trace=None) -> dspy.Prediction:
    """Fraction of the query's constraints that the final response follows (official verifiers, loose).
    For a named stage (GEPA's ``pred_name``) the feedback is that stage's own output checked."""
    results = constraint_results(gold, pred)
    if not results:
        return dspy.Prediction(score=0.0, feedback="The example has no constraints to verify.")
    score = sum(r.followed for r in results) / len(results)
    feedback = module_feedback(gold, pred, pred_name) or _report(results, "The response")
    return dspy.Prediction(score=score, feedback=feedback)


def hint(example, pred_name, prediction, feedback) -> str | None:
    """The constraints the final response violated, as the verifiers describe them, followed by the same
    per-stage feedback GEPA's reflection reads."""
    violated = [r for r in constraint_results(example, prediction) if not r.followed]
    if not violated:
        return None
    lines = "\n".join(f"- {r.description}" for r in violated)
    target = f"The response must also satisfy these constraints, which it currently violates:\n{lines}"
    per_module = module_feedback(example, prediction, pred_name)
    return target if per_module is None else f"{target}\n{per_module}"
