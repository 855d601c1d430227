"""Shared benchmark pieces: data location, splits, normalisation, BM25, LM specs, usage metering."""

import importlib.util

import dspy
import pytest

from benchmarks import common
from benchmarks.common import BM25Search, doc_title, normalize_answer, split_examples
from benchmarks.lms import UsageMeter, make_lm, parse_spec
from dspy_agentgrad.testing import RuleEngine, fake_lm

needs_bm25s = pytest.mark.skipif(
    __import__("importlib").util.find_spec("bm25s") is None, reason="the [bench] extra is not installed"
)


@pytest.fixture(autouse=True)
def _restore_dspy_cache():
    """Runs here repoint DSPy's global cache; give the next test the cache it had."""
    import dspy

    saved = dspy.cache
    yield
    dspy.cache = saved


def test_data_dir_defaults_to_shared_beside_repo(monkeypatch):
    monkeypatch.delenv("AGENTGRAD_DATA_DIR", raising=False)
    assert common.data_dir() == (common.REPO_ROOT.parent / "shared" / "data").resolve()


def test_data_dir_env_override(monkeypatch, tmp_path):
    monkeypatch.setenv("AGENTGRAD_DATA_DIR", str(tmp_path))
    assert common.data_dir() == tmp_path.resolve()
    with pytest.raises(FileNotFoundError, match="AGENTGRAD_DATA_DIR"):
        common.data_file("hotpotqa", "missing.jsonl")


def test_split_is_deterministic_disjoint_and_strict():
    items = list(range(20))
    a = split_examples(items, [5, 5, 5], seed=3)
    b = split_examples(items, [5, 5, 5], seed=3)
    c = split_examples(items, [5, 5, 5], seed=4)
    assert a == b and a != c
    flat = [x for part in a for x in part]
    assert len(flat) == len(set(flat)) == 15
    with pytest.raises(ValueError, match="need 21"):
        split_examples(items, [10, 10, 1], seed=0)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("The Beatles!", "beatles"),
        ("  an   Apple, a day ", "apple day"),
        ("U.S.A.", "usa"),
    ],
)
def test_normalize_answer(text, expected):
    assert normalize_answer(text) == expected


@needs_bm25s
def test_bm25_ranks_and_is_shared_by_copies():
    import copy

    search = BM25Search(["Paris | capital of France", "Berlin | capital of Germany", "Rome | Italian city"])
    assert doc_title(search("Germany capital", 1)[0]) == "Berlin"
    assert len(search("capital", 10)) == 3  # k is capped at the corpus size
    assert copy.deepcopy(search) is search


def test_wiki_corpus_offline_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("AGENTGRAD_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("AGENTGRAD_OFFLINE", "1")
    with pytest.raises(common.CorpusUnavailable, match="not cached"):
        common.wiki_abstracts_path()


def test_wiki_corpus_reads_cached_file(monkeypatch, tmp_path):
    monkeypatch.setenv("AGENTGRAD_CACHE_DIR", str(tmp_path))
    folder = tmp_path / "wiki_abstracts_2017"
    folder.mkdir()
    (folder / common.WIKI_ABSTRACTS_FILE).write_text(
        '{"title": "Alpha", "text": ["First.", "Second."]}\n{"title": "Beta", "text": ["Other."]}\n'
    )
    path = common.wiki_abstracts_path(download=False)
    assert common.load_wiki_abstracts(path) == ["Alpha | First. Second.", "Beta | Other."]


def test_parse_spec_and_make_lm():
    spec = parse_spec("openai/qwen3-8b@http://localhost:8000/v1")
    assert (spec.model, spec.api_bases) == ("openai/qwen3-8b", ["http://localhost:8000/v1"])
    assert parse_spec("openai/gpt-5-mini").api_bases == []
    lm = make_lm("openai/qwen3-8b@http://localhost:8000/v1", cache=False)
    assert lm.model == "openai/qwen3-8b" and lm.kwargs["api_base"] == "http://localhost:8000/v1"
    reasoning = make_lm("openai/gpt-5-mini", cache=False)
    tokens = reasoning.kwargs.get("max_tokens") or reasoning.kwargs.get("max_completion_tokens")
    assert reasoning.kwargs["temperature"] == 1.0 and tokens >= 16000
    with pytest.raises(ValueError, match="rule"):
        make_lm("fake")


def test_usage_meter_counts_by_role_across_threads_and_copies():
    task = fake_lm(lambda call: {"answer": "a"})
    prompt = fake_lm(lambda call: {"answer": "b"})
    meter = UsageMeter()
    meter.attach(task, "task")
    meter.attach(prompt, "prompt")
    predict = dspy.Predict("question -> answer")
    examples = [dspy.Example(question=f"q{i}").with_inputs("question") for i in range(6)]
    with dspy.context(lm=task):
        dspy.Parallel(num_threads=3)([(predict, ex) for ex in examples])
    with dspy.context(lm=prompt.copy(temperature=0.5)):
        predict(question="x")
    snap = meter.snapshot()
    assert snap["task"]["calls"] == 6 and snap["prompt"]["calls"] == 1
    assert snap["task"]["prompt_tokens"] > 0 and snap["task"]["completion_tokens"] > 0
    assert snap["task"]["errors"] == 0 and snap["task"]["cache_hits"] == 0


def test_usage_meter_counts_cache_hits_without_tokens(tmp_path):
    from benchmarks.harness import configure_cache

    configure_cache(tmp_path / "cache")
    engine = RuleEngine(lambda call: {"answer": "a"})
    lm = dspy.LM("fake/cached", engine=engine, cache=True)
    meter = UsageMeter()
    meter.attach(lm, "task")
    predict = dspy.Predict("question -> answer")
    with dspy.context(lm=lm):
        predict(question="same")
        predict(question="same")
    snap = meter.snapshot()["task"]
    assert snap["calls"] == 2 and snap["cache_hits"] == 1
    assert engine.calls == 1  # the second call never reached the engine
    assert snap["prompt_tokens"] > 0


@needs_bm25s
def test_wiki_search_builds_then_reuses_saved_index(monkeypatch, tmp_path):
    monkeypatch.setenv("AGENTGRAD_CACHE_DIR", str(tmp_path))
    folder = tmp_path / "wiki_abstracts_2017"
    folder.mkdir()
    rows = [{"title": f"Doc {i}", "text": [f"topic{i} words here."]} for i in range(20)]
    (folder / common.WIKI_ABSTRACTS_FILE).write_text("".join(__import__("json").dumps(r) + "\n" for r in rows))
    monkeypatch.setattr(common, "_WIKI_SEARCH", None)
    first = common.wiki_abstracts_search(download=False)
    assert (folder / "bm25_index").is_dir()
    assert doc_title(first("topic7", 1)[0]) == "Doc 7"
    monkeypatch.setattr(common, "_WIKI_SEARCH", None)
    import bm25s

    def no_index(*a, **k):
        raise AssertionError("index rebuilt instead of loaded")

    monkeypatch.setattr(bm25s.BM25, "index", no_index)
    second = common.wiki_abstracts_search(download=False)
    assert second is not first and doc_title(second("topic13", 1)[0]) == "Doc 13"


def test_local_lm_is_imported_lazily(monkeypatch):
    import subprocess
    import sys
    import types

    code = (
        "import sys, benchmarks.run, benchmarks.harness, benchmarks.lms\n"
        "assert 'dspy_agentgrad.embedded_lm' not in sys.modules, 'the embedded LM imported eagerly'\nprint('OK')"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=common.REPO_ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0 and "OK" in out.stdout, out.stderr
    sentinel = fake_lm(lambda call: {"answer": "local"})
    module = types.ModuleType("dspy_agentgrad.embedded_lm")
    module.local_lm = lambda: sentinel
    monkeypatch.setitem(sys.modules, "dspy_agentgrad.embedded_lm", module)
    assert make_lm("local") is sentinel


@needs_bm25s
def test_bm25_stems_like_the_paper_when_pystemmer_is_installed():
    corpus = ["Alpha | a story about runners", "Beta | the running of the bulls, with running bulls"]
    plain = BM25Search(corpus, stemmer=None)
    assert plain.stemmer_name is None and doc_title(plain("runners", 1)[0]) == "Alpha"
    if importlib.util.find_spec("Stemmer") is None:
        assert BM25Search(corpus).stemmer_name is None  # runs unstemmed, with a warning
        return
    stemmed = BM25Search(corpus)
    assert stemmed.stemmer_name == "english"
    assert doc_title(stemmed("run", 1)[0]) == "Beta"  # "run" matches "running" (twice) only when stemmed
