"""The IFBench two-stage program: answer the query, then check the answer against the constraints.

Seed instructions carry the meaning of the GEPA paper's (a plain second stage, no list of constraint
kinds), in our own words."""

from __future__ import annotations

import dspy


class RespondToQuery(dspy.Signature):
    """Respond to the query."""

    query: str = dspy.InputField()
    response: str = dspy.OutputField()


class EnforceConstraints(dspy.Signature):
    """Make sure the response is correct and follows the constraints given. What you write is used as the
    final response."""

    query: str = dspy.InputField()
    response: str = dspy.InputField()
    final_response: str = dspy.OutputField()


class IFBenchTwoStage(dspy.Module):
    """Predictors in execution order: ``respond`` then ``enforce_constraints`` (ChainOfThought)."""

    def __init__(self):
        super().__init__()
        self.respond = dspy.ChainOfThought(RespondToQuery)
        self.enforce_constraints = dspy.ChainOfThought(EnforceConstraints)

    def forward(self, query: str) -> dspy.Prediction:
        draft = self.respond(query=query).response
        final = self.enforce_constraints(query=query, response=draft).final_response
        return dspy.Prediction(response=final, draft=draft)
