"""The IFBench two-stage program: answer the query, then rewrite the answer to satisfy every constraint."""

from __future__ import annotations

import dspy


class RespondToQuery(dspy.Signature):
    """Respond to the query."""

    query: str = dspy.InputField()
    response: str = dspy.OutputField()


class EnforceConstraints(dspy.Signature):
    """Rewrite the draft response so that it satisfies every constraint stated in the query (format,
    length, keywords, casing, punctuation, ...) while still answering the query. Output only the final
    response text."""

    query: str = dspy.InputField()
    response: str = dspy.InputField(desc="the draft response")
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
