"""HoVer: claim loading, the 3-hop program on a small corpus fixture, metric, hint, missing corpus."""

import importlib.util

import dspy
import pytest

from benchmarks import load_benchmark
from benchmarks.common import CorpusUnavailable
from benchmarks.hover import HoverMultiHop, discrete_retrieval, hint, load_claims, make_search
from benchmarks.hover.program import K_PER_HOP
from dspy_agentgrad.testing import fake_lm

# the [bench] extra: skipped cleanly when it is not installed
pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("bm25s",)),
    reason="the [bench] extra is not installed",
)

CLAIM = "The Zorblat Quartet recorded Moonfall Serenade, written by a poet from Quillford."
TITLES = ["Zorblat Quartet", "Moonfall Serenade", "Quillford"]
CORPUS = [
    "Zorblat Quartet | The Zorblat Quartet is a string quartet that recorded many pieces.",
    "Moonfall Serenade | Moonfall Serenade is a poem set to music by Ivo Brask.",
    "Ivo Brask | Ivo Brask is a poet.",
    "Quillford | Quillford is a town, birthplace of Ivo Brask.",
] + [f"Filler {i} | unrelated text about topic {i} and the quartet" for i in range(30)]


def _rule(call):
    """Queries name the next gold title only when the instruction says GOOD."""
    if "summary" in call.output_fields:
        return {"reasoning": "r", "summary": "The Zorblat Quartet recorded a serenade."}
    good = "GOOD" in call.instructions
    if "summary_2" in call.inputs:
        return {"reasoning": "r", "query": "Quillford town" if good else "string quartet"}
    return {"reasoning": "r", "query": "Zorblat Quartet" if good else "string quartet"}


def _gold():
    return dspy.Example(claim=CLAIM, titles=TITLES).with_inputs("claim")


def _improve(program):
    for _name, pred in program.named_predictors():
        pred.signature = pred.signature.with_instructions(pred.signature.instructions + " GOOD")
    return program


def test_claims_have_exactly_three_titles():
    claims = load_claims()
    assert len(claims) == 1835
    assert all(len(c.titles) == 3 == len(set(c.titles)) for c in claims)
    assert set(claims[0].inputs().keys()) == {"claim"}


def test_program_retrieves_7_7_10_and_names_predictors():
    search, name = make_search(CORPUS)
    assert name == "fixture" and K_PER_HOP == (7, 7, 10)
    program = HoverMultiHop(search)
    assert [n for n, _ in program.named_predictors()] == [
        "summarize1.predict",
        "create_query_hop2.predict",
        "summarize2.predict",
        "create_query_hop3.predict",
    ]
    with dspy.context(lm=fake_lm(_rule)):
        pred = program(claim=CLAIM)
    assert [len(h) for h in pred.hop_titles] == [7, 7, 10]
    assert len(pred.retrieved_docs) == 24


def test_metric_and_hint_on_fixture_corpus():
    search, _ = make_search(CORPUS)
    gold = _gold()
    with dspy.context(lm=fake_lm(_rule)):
        bad = HoverMultiHop(search, k=(1, 1, 1))(claim=CLAIM)
        good = _improve(HoverMultiHop(search, k=(1, 1, 1)))(claim=CLAIM)
    low = discrete_retrieval(gold, bad)
    assert low.score == 0.0
    assert "Retrieved 2 of 3" in low.feedback and "Missing: Quillford." in low.feedback
    assert "Found: Zorblat Quartet, Moonfall Serenade" in low.feedback  # hop 1 finds Moonfall, the bad queries Zorblat
    high = discrete_retrieval(gold, good)
    assert high.score == 1.0 and "All 3 supporting documents" in high.feedback
    assert "hop 1:" in discrete_retrieval(gold, bad, None, "create_query_hop2.predict", None).feedback
    text = hint(gold, "create_query_hop3.predict", bad, low.feedback)
    assert "Quillford" in text and "Zorblat" not in text and "Moonfall" not in text
    assert hint(gold, "create_query_hop2.predict", good, high.feedback) is None


def test_titles_compare_case_and_space_insensitively():
    gold = dspy.Example(claim="c", titles=["Ab  Cd", "Ef"])
    assert discrete_retrieval(gold, dspy.Prediction(retrieved_titles=["ab cd", "EF"])).score == 1.0


def test_load_benchmark_with_fixture_corpus():
    bench = load_benchmark("hover", train=5, val=5, test=5, seed=0, corpus=CORPUS)
    assert bench.info["corpus"] == "fixture" and bench.info["k_per_hop"] == [7, 7, 10]
    uids = [e.uid for e in bench.trainset + bench.valset + bench.testset]
    assert len(set(uids)) == 15


def test_missing_corpus_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("AGENTGRAD_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("AGENTGRAD_OFFLINE", "1")
    with pytest.raises(CorpusUnavailable, match="HoVer needs the Wikipedia 2017 abstracts"):
        load_benchmark("hover", train=5, val=5, test=5)
