"""The HotpotQA multi-hop program: two BM25 hops, two summaries, one answer (4 CoT predictors)."""

from __future__ import annotations

from collections.abc import Callable

import dspy

from benchmarks.common import doc_title

#: Passages retrieved per hop.
K_PER_HOP = 7


class HotpotMultiHop(dspy.Module):
    """question -> [search] -> summarize1 -> create_query_hop2 -> [search] -> summarize2 -> final_answer.

    Predictors in execution order: ``summarize1``, ``create_query_hop2``, ``summarize2``,
    ``final_answer`` (each a ChainOfThought). ``search(query, k)`` returns ``"title | text"`` passages.
    """

    def __init__(self, search: Callable[[str, int], list[str]], k: int = K_PER_HOP):
        super().__init__()
        self.search = search
        self.k = k
        self.summarize1 = dspy.ChainOfThought("question, passages -> summary")
        self.create_query_hop2 = dspy.ChainOfThought("question, summary_1 -> query")
        self.summarize2 = dspy.ChainOfThought("question, context, passages -> summary")
        self.final_answer = dspy.ChainOfThought("question, summary_1, summary_2 -> answer")

    def forward(self, question: str) -> dspy.Prediction:
        hop1_docs = self.search(question, self.k)
        summary_1 = self.summarize1(question=question, passages=hop1_docs).summary
        hop2_query = self.create_query_hop2(question=question, summary_1=summary_1).query
        hop2_docs = self.search(hop2_query, self.k)
        summary_2 = self.summarize2(question=question, context=summary_1, passages=hop2_docs).summary
        answer = self.final_answer(question=question, summary_1=summary_1, summary_2=summary_2).answer
        return dspy.Prediction(
            answer=answer,
            summary_1=summary_1,
            hop2_query=hop2_query,
            summary_2=summary_2,
            hop1_titles=[doc_title(d) for d in hop1_docs],
            hop2_titles=[doc_title(d) for d in hop2_docs],
        )
