"""The aggregator's reply read as groups of gradients: what the abstraction step receives from the LM
roles (and builds itself for TF-IDF or embedding groups)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class GradientGroup:
    """Indices of gradients that ask for one correction, and that correction in general terms."""

    members: list[int]
    text: str


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
