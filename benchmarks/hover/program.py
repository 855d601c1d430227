"""The HoVer 3-hop claim-retrieval program (summarize, query, summarize, query; 7 + 7 + 10 passages)."""

from __future__ import annotations

from collections.abc import Callable

import dspy

from benchmarks.common import doc_title

#: Passages retrieved by hop 1, 2 and 3.
K_PER_HOP = (7, 7, 10)


class HoverMultiHop(dspy.Module):
    """claim -> [search] -> summarize1 -> create_query_hop2 -> [search] -> summarize2
    -> create_query_hop3 -> [search]; the prediction is every retrieved passage's title.

    Predictors in execution order: ``summarize1``, ``create_query_hop2``, ``summarize2``,
    ``create_query_hop3`` (each a ChainOfThought).
    """

    def __init__(self, search: Callable[[str, int], list[str]], k: tuple[int, int, int] = K_PER_HOP):
        super().__init__()
        self.search = search
        self.k = tuple(k)
        self.summarize1 = dspy.ChainOfThought("claim, passages -> summary")
        self.create_query_hop2 = dspy.ChainOfThought("claim, summary_1 -> query")
        self.summarize2 = dspy.ChainOfThought("claim, context, passages -> summary")
        self.create_query_hop3 = dspy.ChainOfThought("claim, summary_1, summary_2 -> query")

    def forward(self, claim: str) -> dspy.Prediction:
        k1, k2, k3 = self.k
        hop1_docs = self.search(claim, k1)
        summary_1 = self.summarize1(claim=claim, passages=hop1_docs).summary
        hop2_query = self.create_query_hop2(claim=claim, summary_1=summary_1).query
        hop2_docs = self.search(hop2_query, k2)
        summary_2 = self.summarize2(claim=claim, context=summary_1, passages=hop2_docs).summary
        hop3_query = self.create_query_hop3(claim=claim, summary_1=summary_1, summary_2=summary_2).query
        hop3_docs = self.search(hop3_query, k3)
        docs = hop1_docs + hop2_docs + hop3_docs
        return dspy.Prediction(
            retrieved_docs=docs,
            retrieved_titles=list(dict.fromkeys(doc_title(d) for d in docs)),
            hop_titles=[[doc_title(d) for d in hop] for hop in (hop1_docs, hop2_docs, hop3_docs)],
            summary_1=summary_1,
            summary_2=summary_2,
            hop2_query=hop2_query,
            hop3_query=hop3_query,
        )
