"""PUPA's privacy-conscious delegation program (PAPILLON, as in the GEPA paper; our own wording).

A trusted (local, weaker) model rewrites the user's query into a request without private information,
an untrusted stronger model answers that request, and the trusted model writes the final response from
the user's query and the untrusted model's answer. Only the two trusted steps are optimized.
"""

from __future__ import annotations

import dspy


class CraftRedactedRequest(dspy.Signature):
    """From a user's private query, write a request to a more capable external LLM that gets the help
    the user needs while revealing no private information about the user."""

    user_query: str = dspy.InputField()
    llm_request: str = dspy.OutputField()


class RespondToQuery(dspy.Signature):
    """Answer the user's query. A request that was sent to a more capable external LLM, and its answer,
    are given as related material you may draw on."""

    related_llm_request: str = dspy.InputField()
    related_llm_response: str = dspy.InputField(desc="what the external LLM answered to the related request")
    user_query: str = dspy.InputField(desc="the user's query to fulfil")
    response: str = dspy.OutputField(desc="the final response to the user")


class SharedLM:
    """Holds the untrusted LM outside the program's copied state: copies of the program share it."""

    def __init__(self, lm: dspy.BaseLM | None):
        self.lm = lm

    def __deepcopy__(self, memo):
        return self


class PupaDelegation(dspy.Module):
    """user_query -> craft_redacted_request (ChainOfThought) -> [untrusted LM] -> respond_to_query (Predict).

    ``untrusted_lm`` answers the redacted request with a plain prompt (no signature), as in PAPILLON.
    The prediction carries ``llm_request`` and ``llm_response`` for the metric's leakage judge.
    """

    def __init__(self, untrusted_lm: dspy.BaseLM | SharedLM | None = None):
        super().__init__()
        self.untrusted = untrusted_lm if isinstance(untrusted_lm, SharedLM) else SharedLM(untrusted_lm)
        self.craft_redacted_request = dspy.ChainOfThought(CraftRedactedRequest)
        self.respond_to_query = dspy.Predict(RespondToQuery)

    def forward(self, user_query: str) -> dspy.Prediction:
        if self.untrusted.lm is None:
            raise RuntimeError("PupaDelegation needs an untrusted LM (PupaDelegation(untrusted_lm=...))")
        llm_request = self.craft_redacted_request(user_query=user_query).llm_request
        llm_response = self.untrusted.lm(llm_request)[0]
        if isinstance(llm_response, dict):  # some LMs return {"text": ...}
            llm_response = llm_response.get("text", "")
        response = self.respond_to_query(
            related_llm_request=llm_request, related_llm_response=llm_response, user_query=user_query
        ).response
        return dspy.Prediction(llm_request=llm_request, llm_response=llm_response, response=response)
