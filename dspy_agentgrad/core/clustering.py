"""Grouping gradients: the cyclic minimum-size schedule, LM cluster clean-up, TF-IDF
grouping (deterministic, no LM), grouping by embedding vectors, and random minibatches
for the ablation."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass
class GradientGroup:
    """Indices of gradients that ask for one correction, and that correction in general terms."""

    members: list[int]
    text: str


def min_cluster_size(schedule: Sequence[int], round_index: int) -> int:
    """Round r uses schedule[r mod len]: broad patterns, then finer ones, then again."""
    return schedule[round_index % len(schedule)]


def normalize_clusters(raw: list[tuple[object, object]], n: int) -> list[GradientGroup]:
    """Keep valid, unique member numbers; each gradient lands in at most one cluster;
    gradients the LM left out become clusters of their own (with their own text as gradient)."""
    taken: set[int] = set()
    clusters: list[GradientGroup] = []
    for members, text in raw:
        valid = []
        for m in members if isinstance(members, list) else []:
            try:
                m = int(m)
            except (TypeError, ValueError):
                continue
            if 0 <= m < n and m not in taken:
                taken.add(m)
                valid.append(m)
        if valid and isinstance(text, str) and text.strip():
            clusters.append(GradientGroup(valid, text.strip()))
        else:
            taken.difference_update(valid)
    return clusters + [GradientGroup([m], "") for m in range(n) if m not in taken]


def tfidf_groups(texts: list[str], distance_threshold: float = 0.8) -> list[list[int]]:
    """Agglomerative clustering of TF-IDF vectors (cosine, average linkage)."""
    if len(texts) < 2:
        return [list(range(len(texts)))] if texts else []
    from sklearn.feature_extraction.text import TfidfVectorizer

    try:
        vectors = TfidfVectorizer(stop_words="english").fit_transform(texts).toarray()
    except ValueError:  # only stop words: nothing to compare, one group
        return [list(range(len(texts)))]
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
    """Groups of row indices, each group listed by its first member; a zero row means one group."""
    from sklearn.cluster import AgglomerativeClustering

    if not vectors.any(axis=1).all():
        return [list(range(len(vectors)))]
    labels = AgglomerativeClustering(
        n_clusters=None, distance_threshold=distance_threshold, metric="cosine", linkage="average"
    ).fit_predict(vectors)
    groups: dict[int, list[int]] = {}
    for index, label in enumerate(labels):
        groups.setdefault(int(label), []).append(index)
    return sorted(groups.values(), key=lambda g: g[0])


def random_minibatches(n: int, size: int, rng: random.Random) -> list[list[int]]:
    """Indices 0..n-1 shuffled and cut into batches of ``size``: the ablation without semantic abstraction."""
    order = list(range(n))
    rng.shuffle(order)
    return [order[i : i + size] for i in range(0, n, max(1, size))]
