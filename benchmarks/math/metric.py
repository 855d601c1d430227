"""MATH metric through ``math-verify`` (answers compared as mathematical objects), feedback per step,
and AgentGrad's hint."""

from __future__ import annotations

import dspy

from benchmarks.common import MissingExtra

MISSING = "the MATH metric needs math-verify: pip install 'dspy-agentgrad[math]' (or pip install math-verify)"


def require_math_verify() -> None:
    """Fail early, with what to install, when math-verify is missing."""
    try:
        import math_verify  # noqa: F401
    except ImportError as exc:
        raise MissingExtra(MISSING) from exc


def _parse(text: str):
    """A bare answer ("3 + x") is read as one LaTeX expression first: math-verify's plain-text reading
    takes its last number. Timeouts off: math-verify's use signals, which work only in the main thread."""
    from math_verify import parse

    bare = "$" not in text and "\\boxed" not in text
    parsed = parse(f"${text}$", parsing_timeout=None) if bare else []
    return parsed or parse(text, parsing_timeout=None)


def answers_match(gold: str, predicted: str) -> bool:
    """Whether ``predicted`` is the same mathematical answer as ``gold`` (LaTeX or plain)."""
    from math_verify import verify

    gold, predicted = str(gold or "").strip(), str(predicted or "").strip()
    if not gold or not predicted:
        return False
    target, guess = _parse(gold), _parse(predicted)
    return bool(target) and bool(guess) and bool(verify(target, guess, timeout_seconds=None))


def _step_feedback(gold, pred, pred_name: str | None) -> str | None:
    """What one step did: the solver's draft, or what the verifier made of it."""
    if pred is None or not pred_name:
        return None
    reference = str(gold.answer)
    draft, final = str(pred.get("draft_answer", "")), str(pred.get("answer", ""))
    draft_ok, final_ok = answers_match(reference, draft), answers_match(reference, final)
    if "solve" in pred_name:
        verdict = "right" if draft_ok else "wrong"
        return f"The solver's draft answer '{draft}' is {verdict}; the reference answer is '{reference}'."
    if "verify" in pred_name:
        if draft_ok and not final_ok:
            what = f"the draft's answer '{draft}' was right, but the verifier changed it to '{final}'"
        elif not draft_ok and final_ok:
            what = f"the draft's answer '{draft}' was wrong and the verifier fixed it to '{final}'"
        elif draft_ok:
            what = f"the verifier kept the right answer '{final}'"
        else:
            what = f"the draft's answer '{draft}' was wrong and the verifier's final answer '{final}' is wrong too"
        return f"{what[0].upper()}{what[1:]}; the reference answer is '{reference}'."
    return None


def math_metric(gold, pred, trace=None, pred_name=None, pred_trace=None) -> dspy.Prediction:
    """1.0 when the final answer equals the reference answer (math-verify), else 0.0, with feedback."""
    predicted = "" if pred is None else str(pred.get("answer", "") or "")
    score = float(answers_match(gold.answer, predicted))
    feedback = _step_feedback(gold, pred, pred_name)
    if feedback is None:
        feedback = (
            f"Correct: the answer '{predicted}' equals the reference answer '{gold.answer}'."
            if score
            else f"Incorrect: the answer was '{predicted}', the reference answer is '{gold.answer}'."
        )
    if not score and gold.get("solution"):
        feedback += f" Reference solution: {gold.solution}"
    return dspy.Prediction(score=score, feedback=feedback)


def hint(example, pred_name, prediction, feedback) -> str | None:
    """The reference answer in the form the step must give, then the step's own feedback."""
    answer = str(example.get("answer", "") or "")
    if not answer:
        return None
    name = (pred_name or "").lower()
    if "verify" in name:
        target = f"The correct final answer is {answer}. Check the draft against it and give exactly this answer."
    else:
        target = f"The correct answer is {answer}. Solve the problem so that the draft answer is exactly this."
    steps = _step_feedback(example, prediction, pred_name)
    return target if steps is None else f"{target}\n{steps}"
