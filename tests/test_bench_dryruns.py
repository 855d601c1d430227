"""Fake-LM dry runs of the whole runner on HoVer and IFBench (HotpotQA: test_bench_runner.py, PUPA:
test_bench_pupa.py), so every benchmark is exercised end to end offline."""

from __future__ import annotations

import importlib.util
import json

import dspy
import pytest

from benchmarks import common, run

needs = {
    "hover": ("bm25s", "matplotlib"),
    "ifbench": ("nltk", "if_verifiable", "matplotlib"),
}


@pytest.fixture(autouse=True)
def _restore_dspy_cache():
    saved = dspy.cache
    yield
    dspy.cache = saved


def _hover_fixture_corpus(monkeypatch):
    """Every supporting title of the dev claims as a passage, in place of the Wikipedia abstracts."""
    from benchmarks import hover

    titles = sorted({t for claim in hover.load_claims() for t in claim.titles})
    search = common.BM25Search([f"{t} | An article about {t}." for t in titles], stemmer=None)
    monkeypatch.setattr(hover, "wiki_abstracts_search", lambda download=True: search)


@pytest.mark.parametrize("bench", sorted(needs))
def test_fake_lm_dry_run(bench, tmp_path, monkeypatch):
    missing = [m for m in needs[bench] if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"the [bench] extra is not installed ({', '.join(missing)})")
    if bench == "hover":
        _hover_fixture_corpus(monkeypatch)
    optimizers = ["agentgrad", "gepa"] + (["miprov2"] if importlib.util.find_spec("optuna") else [])
    out = tmp_path / bench
    args = ["--bench", bench, "--task-lm", "fake", "--prompt-lm", "fake", "--max-metric-calls", "40"]
    args += ["--train", "6", "--val", "6", "--test", "6", "--num-threads", "2", "--optimizers", ",".join(optimizers)]
    assert run.main([*args, "--out", str(out)]) == 0
    entries = json.loads((out / "results.json").read_text())["benchmarks"][bench]["optimizers"]
    assert set(entries) == {"baseline", *optimizers}
    assert all(e["status"] == "done" and e["metric_calls"] > 0 for e in entries.values())
    assert "## Setup" in (out / "results.md").read_text()
