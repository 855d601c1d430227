"""Grouping gradients: TF-IDF grouping (deterministic, no LM), grouping by embedding vectors, and random
minibatches for the ablation. The cyclic minimum-size schedule is a rule of the round (:mod:`.round_rules`)."""

from __future__ import annotations

import random
from collections.abc import Sequence


def tfidf_groups(texts: list[str], distance_threshold: float = 0.8) -> list[list[int]]:
    """Agglomerative clustering of TF-IDF vectors (cosine, average linkage)."""
    if len(texts) < 2:
        return [list(range(len(texts)))] if texts else []
    from sklearn.feature_extraction.text import TfidfVectorizer

    try:
        vectors = TfidfVectorizer(stop_words="english").fit_transform(texts).toarray()
    except ValueError:  # only stop words: nothing to compare, each text on its own
        return [[i] for i in range(len(texts))]
    return _cosine_groups(vectors, distance_threshold)


def embedding_groups(vectors: Sequence[Sequence[float]], distance_threshold: float = 0.3) -> list[list[int]]:
    """Agglomerative clustering of embedding vectors (cosine distance, average linkage).

    Sentence embeddings put paraphrases much closer than TF-IDF does, hence the
    tighter default threshold (cosine similarity above 0.7 on average joins).
    """
    if len(vectors) < 2:
        return [list(range(len(vectors)))] if len(vectors) else []
    import numpy as np

    return _cosine_groups(np.asarray(vectors, dtype=float), distance_threshold)


def _cosine_groups(vectors, distance_threshold: float) -> list[list[int]]:
    """Groups of row indices, each group listed by its first member. A zero row (a text with no word the
    vectorizer keeps, an embedder's empty answer) has no direction: it is a group of its own."""
    from sklearn.cluster import AgglomerativeClustering

    nonzero = [i for i, row in enumerate(vectors) if row.any()]
    groups: dict[object, list[int]] = {("zero", i): [i] for i in range(len(vectors)) if i not in set(nonzero)}
    if len(nonzero) == 1:
        groups[0] = nonzero
    elif nonzero:
        labels = AgglomerativeClustering(
            n_clusters=None, distance_threshold=distance_threshold, metric="cosine", linkage="average"
        ).fit_predict(vectors[nonzero])
        for index, label in zip(nonzero, labels):
            groups.setdefault(int(label), []).append(index)
    return sorted(groups.values(), key=lambda g: g[0])


def random_minibatches(n: int, size: int, rng: random.Random) -> list[list[int]]:
    """Indices 0..n-1 shuffled and cut into batches of ``size``: the ablation without semantic abstraction."""
    order = list(range(n))
    rng.shuffle(order)
    return [order[i : i + size] for i in range(0, n, max(1, size))]
