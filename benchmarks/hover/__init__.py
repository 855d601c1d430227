"""HoVer multi-hop claim retrieval (program of the GEPA paper, our own code)."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from pathlib import Path

import dspy

from benchmarks.common import (
    BM25Search,
    CorpusUnavailable,
    artifact_splits,
    cache_dir,
    data_file,
    download_file,
    split_examples,
    wiki_abstracts_search,
)
from benchmarks.hover.metric import discrete_retrieval, found_and_missing, hint
from benchmarks.hover.program import K_PER_HOP, HoverMultiHop
from benchmarks.registry import Benchmark

__all__ = [
    "HoverMultiHop",
    "discrete_retrieval",
    "found_and_missing",
    "hint",
    "load_benchmark",
    "load_claims",
    "make_search",
]

HOVER_FILE = ("hover", "hover_dev_release_v1.1.json")
#: HoVer train (what the GEPA paper's code uses), from the HoVer repository; downloaded once when online.
HOVER_TRAIN_URL = "https://raw.githubusercontent.com/hover-nlp/hover/main/data/hover/hover_train_release_v1.1.json"

NEEDS_CORPUS = (
    "HoVer needs the Wikipedia 2017 abstracts corpus for retrieval, and it is not available offline. "
    "Run with network access once (it is downloaded and cached), put the unpacked "
    "wiki.abstracts.2017.jsonl under $AGENTGRAD_CACHE_DIR/wiki_abstracts_2017/, or pass a corpus."
)


def load_claims(path: Path | None = None, hops: int = 3) -> list[dspy.Example]:
    """HoVer dev claims whose supporting facts cover exactly ``hops`` distinct titles, file order."""
    with open(path or data_file(*HOVER_FILE), encoding="utf-8") as fh:
        rows = json.load(fh)
    out = []
    for row in rows:
        titles = list(dict.fromkeys(t for t, _ in row["supporting_facts"]))
        if len(titles) == hops:
            out.append(
                dspy.Example(uid=row["uid"], claim=row["claim"], titles=titles, label=row["label"]).with_inputs("claim")
            )
    return out


def make_search(corpus: str | Sequence[str] = "auto") -> tuple[Callable, str]:
    if not isinstance(corpus, str):
        return BM25Search(list(corpus)), "fixture"
    if corpus in ("wiki", "auto"):
        try:
            return wiki_abstracts_search(download=True), "wiki"
        except CorpusUnavailable as exc:
            raise CorpusUnavailable(f"{NEEDS_CORPUS} ({exc})") from exc
    raise ValueError(f"unknown HoVer corpus {corpus!r} (wiki, auto, or a list of passages)")


def load_benchmark(
    train: int = 150,
    val: int = 300,
    test: int | None = 300,
    seed: int = 0,
    corpus: str | Sequence[str] = "auto",
    path: Path | None = None,
    k=K_PER_HOP,
    split: str = "seeded",
    source: str = "offline",
) -> Benchmark:
    """The HoVer benchmark: 3-hop claims, split by ``seed``; ``split="paper"``: the GEPA paper code's
    procedure (shuffle with ``random.Random(0)``, 40/40/20 cut into test/val/train, sampled down to
    300/300/150). ``source="offline"``: the dev release of the shared data; ``"online"``: HoVer train
    (the paper's), downloaded once from the HoVer repository into ``$AGENTGRAD_CACHE_DIR/hover``.

    Raises :class:`CorpusUnavailable` when the Wikipedia abstracts cannot be had, and
    :class:`DataUnavailable` when HoVer train cannot be downloaded."""
    test = 300 if test is None else test
    if source == "online" and path is None:
        path = download_file(
            HOVER_TRAIN_URL, cache_dir() / "hover" / HOVER_TRAIN_URL.rsplit("/", 1)[1], what="HoVer train"
        )
    elif source != "offline":
        raise ValueError(f"unknown source {source!r} (offline, online)")
    claims = load_claims(path)
    if split == "paper":
        random.Random(0).shuffle(claims)
        trainset, valset, testset = artifact_splits(claims)
    else:
        trainset, valset, testset = split_examples(claims, [train, val, test], seed)
    search, corpus_name = make_search(corpus)
    info = {
        "source": f"{'hover_train' if source == 'online' else 'hover_dev'}_release_v1.1 (3-hop claims)",
        "corpus": corpus_name,
        "corpus_note": "Wikipedia 2017 abstracts, BM25" if corpus_name == "wiki" else "caller-supplied corpus",
        "corpus_size": len(search),
        "k_per_hop": list(k),
        "split": "paper procedure (GEPA artifact) on the dev release" if split == "paper" else f"seeded ({seed})",
        "split_seed": seed,
        "sizes": {"train": len(trainset), "val": len(valset), "test": len(testset)},
        "metric": "1 if every gold supporting title was retrieved",
    }
    return Benchmark(
        "hover", trainset, valset, testset, lambda: HoverMultiHop(search, k=k), discrete_retrieval, hint, info
    )
