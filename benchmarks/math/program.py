"""The MATH program: a solver, then a verifier that checks the draft and gives the final answer.

Two steps whose faults differ and can each be blamed: the solver's draft can be wrong, and the
verifier can keep a wrong draft or spoil a right one. The solver writes its worked solution as an
output (the verifier reads it), so the verifier reasons about the draft rather than starting over.
"""

from __future__ import annotations

import dspy


class SolveProblem(dspy.Signature):
    """Solve the math competition problem. Work through it step by step, then give the final answer alone,
    in simplest form (a number, an expression or LaTeX), without words or units."""

    problem: str = dspy.InputField()
    solution: str = dspy.OutputField(desc="the worked solution, step by step")
    draft_answer: str = dspy.OutputField(desc="the final answer alone")


class VerifyAnswer(dspy.Signature):
    """Check a draft solution to a math competition problem step by step, looking for errors in its
    reasoning and arithmetic. Keep the draft's answer when it is right; otherwise solve the problem again.
    Give the final answer alone, in simplest form."""

    problem: str = dspy.InputField()
    solution: str = dspy.InputField(desc="the draft's worked solution")
    draft_answer: str = dspy.InputField()
    answer: str = dspy.OutputField(desc="the final answer alone")


class SolveThenVerify(dspy.Module):
    """Predictors in execution order: ``solve`` (Predict) then ``verify`` (ChainOfThought)."""

    def __init__(self):
        super().__init__()
        self.solve = dspy.Predict(SolveProblem)
        self.verify = dspy.ChainOfThought(VerifyAnswer)

    def forward(self, problem: str) -> dspy.Prediction:
        draft = self.solve(problem=problem)
        final = self.verify(problem=problem, solution=draft.solution, draft_answer=draft.draft_answer)
        return dspy.Prediction(solution=draft.solution, draft_answer=draft.draft_answer, answer=final.answer)
