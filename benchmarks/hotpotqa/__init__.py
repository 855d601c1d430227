"""HotpotQA multi-hop QA benchmark (program of the GEPA paper, our own code)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from benchmarks.common import BM25Search, CorpusUnavailable, wiki_abstracts_search
from benchmarks.hotpotqa.data import offline_splits, online_splits, paper_splits, pooled_corpus, read_rows
from benchmarks.hotpotqa.metric import answer_exact_match, hint
from benchmarks.hotpotqa.program import K_PER_HOP, HotpotMultiHop
from benchmarks.registry import Benchmark

logger = logging.getLogger(__name__)

__all__ = ["HotpotMultiHop", "answer_exact_match", "hint", "load_benchmark", "make_search"]

CORPUS_NOTES = {
    "wiki": "Wikipedia 2017 abstracts (as in the GEPA paper), BM25",
    "pooled": "offline: pooled context paragraphs of the HotpotQA distractor sample "
    "(easier than the full corpus), BM25",
    "fixture": "a corpus passed in by the caller (tests)",
}


def make_search(corpus: str | Sequence[str] = "auto", rows: list[dict] | None = None) -> tuple[Callable, str]:
    """(search, corpus_name). ``corpus``: "wiki", "pooled", "auto" (wiki when it can be had, else
    pooled, with a warning) or a list of ``"title | text"`` passages."""
    if not isinstance(corpus, str):
        return BM25Search(list(corpus)), "fixture"
    if corpus in ("wiki", "auto"):
        try:
            return wiki_abstracts_search(download=True), "wiki"
        except CorpusUnavailable as exc:
            if corpus == "wiki":
                raise
            logger.warning("HotpotQA: %s -- falling back to the pooled offline corpus", exc)
    if corpus in ("pooled", "auto"):
        return BM25Search(pooled_corpus(rows if rows is not None else read_rows())), "pooled"
    raise ValueError(f"unknown HotpotQA corpus {corpus!r} (wiki, pooled, auto)")


def load_benchmark(
    train: int = 150,
    val: int = 300,
    test: int | None = 300,
    seed: int = 0,
    corpus: str | Sequence[str] = "auto",
    source: str = "offline",
    k: int = K_PER_HOP,
    split: str = "seeded",
) -> Benchmark:
    """The HotpotQA benchmark. ``source="offline"``: the shared distractor sample, split by ``seed``;
    ``"online"``: HotpotQA train (train/val) and dev (test) through ``dspy.datasets.HotPotQA``, or with
    ``split="paper"`` the GEPA paper code's split of HotpotQA train (sizes fixed at 150/300/300)."""
    test = 300 if test is None else test
    rows = None
    if split == "paper" and source == "online":
        trainset, valset, testset = paper_splits()
        if corpus == "auto":
            corpus = "wiki"
    elif split == "paper":
        raise ValueError("the paper's HotpotQA split needs HotpotQA train: use --source online")
    elif source == "offline":
        (trainset, valset, testset), rows = offline_splits(train, val, test, seed)
    elif source == "online":
        trainset, valset, testset = online_splits(train, val, test, seed)
        if corpus == "auto":
            corpus = "wiki"  # the pooled sample paragraphs do not cover online questions
    else:
        raise ValueError(f"unknown source {source!r} (offline, online)")
    search, corpus_name = make_search(corpus, rows)
    info = {
        "source": source,
        "corpus": corpus_name,
        "corpus_note": CORPUS_NOTES[corpus_name],
        "corpus_size": len(search),
        "k_per_hop": k,
        "split": "paper (GEPA artifact)" if split == "paper" else f"seeded ({seed})",
        "split_seed": seed,
        "sizes": {"train": len(trainset), "val": len(valset), "test": len(testset)},
        "metric": "exact match after answer normalisation",
    }
    return Benchmark(
        "hotpotqa", trainset, valset, testset, lambda: HotpotMultiHop(search, k=k), answer_exact_match, hint, info
    )
