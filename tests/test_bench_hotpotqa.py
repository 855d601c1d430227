"""HotpotQA: loader, pooled corpus, program on the fake LM, metric, hint."""

import importlib.util

import dspy
import pytest

from benchmarks import load_benchmark
from benchmarks.fake_world import BenchWorld, fix_token
from benchmarks.hotpotqa import HotpotMultiHop, answer_exact_match, hint, make_search
from benchmarks.hotpotqa.data import offline_splits, pooled_corpus, read_rows
from dspy_agentgrad.testing import fake_lm

# the [bench] extra: skipped cleanly when it is not installed
pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("bm25s",)),
    reason="the [bench] extra is not installed",
)


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("hotpotqa", train=10, val=8, test=6, seed=0, corpus="pooled")


def test_offline_loader_splits(bench):
    assert bench.info["corpus"] == "pooled" and bench.info["sizes"] == {"train": 10, "val": 8, "test": 6}
    ids = [e.id for e in bench.trainset + bench.valset + bench.testset]
    assert len(ids) == len(set(ids)) == 24
    again = load_benchmark("hotpotqa", train=10, val=8, test=6, seed=0, corpus="pooled")
    assert [e.id for e in again.valset] == [e.id for e in bench.valset]
    other = load_benchmark("hotpotqa", train=10, val=8, test=6, seed=1, corpus="pooled")
    assert [e.id for e in other.valset] != [e.id for e in bench.valset]
    ex = bench.trainset[0]
    assert set(ex.inputs().keys()) == {"question"} and ex.answer and ex.gold_titles


def test_offline_loader_refuses_paper_sizes():
    with pytest.raises(ValueError, match="smaller --train/--val/--test"):
        offline_splits(150, 300, 300, seed=0)


def test_pooled_corpus_has_every_context_paragraph_once():
    rows = read_rows()
    corpus = pooled_corpus(rows)
    titles = [doc.split(" | ", 1)[0] for doc in corpus]
    assert len(titles) == len(set(titles))
    assert {t for r in rows for t in r["context"]["title"]} == set(titles)
    gold = set(rows[0]["supporting_facts"]["title"])
    assert gold <= set(titles)


def test_program_runs_four_predictors_in_order(bench):
    world = BenchWorld(bench.trainset + bench.valset + bench.testset, easy_every=10**9)
    program = bench.make_program()
    assert [n for n, _ in program.named_predictors()] == [
        "summarize1.predict",
        "create_query_hop2.predict",
        "summarize2.predict",
        "final_answer.predict",
    ]
    ex = bench.valset[0]
    with dspy.context(lm=fake_lm(world), trace=[]):
        pred = program(**ex.inputs())
        called = [type(p).__name__ for p, _, _ in dspy.settings.trace]
    assert len(called) == 4
    assert len(pred.hop1_titles) == 7 and len(pred.hop2_titles) == 7
    assert pred.answer == "unknown"  # no fix token, not an easy example: the world answers wrong
    assert answer_exact_match(ex, pred).score == 0.0
    # The fix token on the answerer makes it answer the gold answer.
    fixed = program.deepcopy()
    sig = fixed.final_answer.predict.signature
    fixed.final_answer.predict.signature = sig.with_instructions(sig.instructions + " " + fix_token("answer"))
    with dspy.context(lm=fake_lm(world)):
        assert answer_exact_match(ex, fixed(**ex.inputs())).score == 1.0


def test_program_with_fixture_corpus():
    search, name = make_search(["Ada Lovelace | mathematician", "Charles Babbage | engineer", "Other | text"])
    assert name == "fixture"
    world = BenchWorld(
        [
            dspy.Example(
                question="Who worked with Charles Babbage?",
                answer="Ada Lovelace",
                gold_titles=["Ada Lovelace", "Charles Babbage"],
            )
        ]
    )
    with dspy.context(lm=fake_lm(world)):
        pred = HotpotMultiHop(search, k=2)(question="Who worked with Charles Babbage?")
    assert pred.hop1_titles[0] == "Charles Babbage" and len(pred.hop2_titles) == 2


def test_metric_normalises_and_gives_feedback():
    gold = dspy.Example(question="q", answer="The Beatles", gold_titles=["A", "B"])
    right = answer_exact_match(gold, dspy.Prediction(answer="beatles!", hop1_titles=["A"], hop2_titles=["C"]))
    assert right.score == 1.0 and "Correct" in right.feedback
    wrong = answer_exact_match(gold, dspy.Prediction(answer="Rolling Stones", hop1_titles=["A"], hop2_titles=["C"]))
    assert wrong.score == 0.0
    assert "'The Beatles'" in wrong.feedback and "Never retrieved: B" in wrong.feedback
    assert answer_exact_match(gold, None).score == 0.0
    # GEPA's per-predictor call shape is accepted.
    assert answer_exact_match(gold, dspy.Prediction(answer="beatles"), None, "final_answer.predict", None).score == 1.0


def test_hint_is_specific_to_the_predictor():
    ex = dspy.Example(question="q", answer="Paris", gold_titles=["France", "Paris"])
    assert "'Paris'" in hint(ex, "final_answer.predict", None, "")
    assert "France, Paris" in hint(ex, "create_query_hop2.predict", None, "")
    assert "France, Paris" in hint(ex, "summarize1.predict", None, "") and "Paris" in hint(ex, "summarize2", None, "")


def test_online_source_code_path(monkeypatch):
    """The online loader (dspy.datasets.HotPotQA) on a stand-in dataset: sizes, fields, gold titles."""
    import dspy.datasets

    captured = {}

    class FakeHotPotQA:
        def __init__(self, **kwargs):
            captured.update(kwargs)

            def mk(i):
                return dspy.Example(id=f"x{i}", question=f"q{i}?", answer=f"a{i}", gold_titles={f"T{i}", "U"})

            self.train = [mk(i) for i in range(kwargs["train_size"])]
            self.dev = [mk(100 + i) for i in range(kwargs["dev_size"])]

    monkeypatch.setattr(dspy.datasets, "HotPotQA", FakeHotPotQA)
    from benchmarks.hotpotqa.data import online_splits

    train, val, test = online_splits(3, 2, 4, seed=0)
    assert (len(train), len(val), len(test)) == (3, 2, 4)
    assert captured["keep_details"] is True and captured["test_size"] == 0
    assert train[0].gold_titles == ["T0", "U"] and set(train[0].inputs().keys()) == {"question"}
    assert {e.id for e in train}.isdisjoint({e.id for e in val})
