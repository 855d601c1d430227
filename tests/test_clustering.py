"""Abstraction's pieces: the minimum cluster size per round, the aggregator's groups made whole, TF-IDF grouping."""

from __future__ import annotations

from dspy_agentgrad.core.clustering import tfidf_groups
from dspy_agentgrad.core.round_rules import RoundRules
from dspy_agentgrad.roles.gradient_groups import GradientGroup, normalize_clusters


def test_cyclic_schedule_repeats():
    assert [RoundRules((3, 2, 1), 1, None).minimum(r) for r in range(7)] == [3, 2, 1, 3, 2, 1, 3]


def test_normalize_clusters_drops_bad_members_and_keeps_every_gradient_once():
    raw = [([0, "2", 2, 9, "x"], " fix A "), ([1, 2], "fix B"), ([3], ""), ("not a list", "fix C")]
    groups = normalize_clusters(raw, 4)
    assert groups[:2] == [GradientGroup([0, 2], "fix A"), GradientGroup([1], "fix B")]
    assert sorted(m for g in groups for m in g.members) == [0, 1, 2, 3]
    assert GradientGroup([3], "") in groups  # an empty text leaves its member on its own


def test_tfidf_groups_separates_unrelated_corrections():
    texts = ["always cite the passage title", "cite the passage title always", "answer in lowercase letters only"]
    groups = tfidf_groups(texts)
    assert sorted(map(sorted, groups)) == [[0, 1], [2]]
    assert tfidf_groups([]) == [] and tfidf_groups(["one"]) == [[0]]
    assert tfidf_groups(["the a", "an the"]) == [[0], [1]]  # stop words only: nothing shows them alike, each alone
