"""PUPA: data and the paper's split, the judge metric with feedback per module, the hint built from the
same feedback, a fake-LM dry run of the whole head-to-head, and a clear error when data must be downloaded
without network."""

from __future__ import annotations

import importlib.util
import json

import dspy
import pytest

from benchmarks import common, load_benchmark, run
from benchmarks.fake_world import BenchWorld
from benchmarks.pupa import load_subset, pii_units
from benchmarks.pupa.data import PAPER_SPLIT
from dspy_agentgrad.testing import fake_lm


@pytest.fixture(autouse=True)
def _restore_dspy_cache():
    saved = dspy.cache
    yield
    dspy.cache = saved


def _bench(**kw):
    bench = load_benchmark("pupa", **{"train": 6, "val": 6, "test": 6, "seed": 0, **kw})
    world = BenchWorld(bench.trainset + bench.valset + bench.testset)
    judge, untrusted = fake_lm(world), fake_lm(world)
    bench.bind_lms({"judge": judge, "untrusted": untrusted})
    return bench, world, judge


def test_pupa_new_paper_split_and_tnb_for_transfer():
    new, tnb = load_subset("new"), load_subset("tnb")
    assert (len(new), len(tnb)) == (664, 237)
    bench = load_benchmark("pupa", split="paper")
    sizes = (len(bench.trainset), len(bench.valset), len(bench.testset))
    assert sizes == PAPER_SPLIT == (111, 111, 221)
    assert [e.user_query for e in bench.trainset[:2]] == [e.user_query for e in new[:2]]  # file order
    assert bench.testset[0].user_query == new[222].user_query
    example = new[0]
    assert set(example.inputs().keys()) == {"user_query"}
    assert set(example.labels().keys()) == {"target_response", "pii_str"}  # nothing else for the leak guard
    assert pii_units(dspy.Example(pii_str="a||b||a")) == ["a", "b"]


def test_metric_scores_quality_and_leakage_and_gives_each_module_its_feedback():
    bench, world, _judge = _bench()
    ex = bench.valset[0]
    units = pii_units(ex)
    leaky = dspy.Prediction(llm_request=ex.user_query, llm_response="x", response="ok")
    clean = dspy.Prediction(llm_request="Help me with a task.", llm_response="x", response="A real answer.")
    low, high = bench.metric(ex, leaky), bench.metric(ex, clean)
    assert high.score == 1.0
    assert low.score == pytest.approx(0.0 if units else 0.5)  # worse response and every unit leaked
    craft = bench.metric(ex, leaky, None, "craft_redacted_request.predict", None).feedback
    respond = bench.metric(ex, leaky, None, "respond_to_query", None).feedback
    assert "request sent to the untrusted external LLM" in craft and "final response" in respond
    assert craft != respond
    if units:
        assert units[0] in craft  # the redactor hears which private units leaked
    judged = world.calls["judge_quality"] + world.calls["judge_leakage"]
    bench.metric(ex, leaky, None, "respond_to_query", None)
    assert world.calls["judge_quality"] + world.calls["judge_leakage"] == judged  # memoised judgement


def test_hint_carries_the_same_module_feedback_as_the_gepa_metric():
    bench, _world, _judge = _bench()
    ex = next(e for e in bench.valset if pii_units(e))
    pred = dspy.Prediction(llm_request=ex.user_query, llm_response="x", response="ok")
    for name in ("craft_redacted_request.predict", "respond_to_query"):
        feedback = bench.metric(ex, pred, None, name, None).feedback
        assert feedback in bench.hint(ex, name, pred, "")
    good = dspy.Prediction(llm_request="Help me.", llm_response="x", response="A real answer.")
    assert bench.hint(ex, "craft_redacted_request.predict", good, "") is None


def test_fake_lm_dry_run_of_every_optimizer_meters_the_judge_and_untrusted_lms(tmp_path):
    out = tmp_path / "pupa"
    args = ["--bench", "pupa", "--task-lm", "fake", "--prompt-lm", "fake", "--max-metric-calls", "40"]
    args += ["--train", "6", "--val", "6", "--test", "6", "--num-threads", "2", "--out", str(out)]
    optimizers = ["agentgrad", "gepa"] + (["miprov2"] if importlib.util.find_spec("optuna") else [])
    assert run.main([*args, "--optimizers", ",".join(optimizers)]) == 0  # MIPROv2 needs the [bench] extra
    results = json.loads((out / "results.json").read_text())
    entries = results["benchmarks"]["pupa"]["optimizers"]
    assert set(entries) == {"baseline", *optimizers}
    assert all(e["status"] == "done" for e in entries.values())
    assert entries["agentgrad"]["usage"]["judge"]["calls"] > 0
    assert entries["agentgrad"]["usage"]["untrusted"]["calls"] > 0
    assert entries["gepa"]["test_score"] > entries["baseline"]["test_score"]  # the world can be improved
    assert "PUPA" in (out / "results.md").read_text()


def test_program_without_untrusted_lm_says_what_to_do():
    bench = load_benchmark("pupa", train=1, val=1, test=1)
    with pytest.raises(RuntimeError, match="untrusted LM"):
        bench.make_program()(user_query="hi")


def test_online_data_without_network_is_a_clear_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("AGENTGRAD_CACHE_DIR", str(tmp_path / "cache"))

    def no_network(*args, **kwargs):
        raise OSError("[Errno -2] Name or service not known")

    monkeypatch.setattr("urllib.request.urlopen", no_network)
    monkeypatch.setitem(__import__("sys").modules, "datasets", None)  # the GitHub CSV path
    with pytest.raises(common.DataUnavailable, match="--source offline"):
        load_subset("new", source="online")
    out = tmp_path / "out"
    code = run.main(["--bench", "pupa", "--source", "online", "--task-lm", "fake", "--out", str(out)])
    assert code == 2
    err = capsys.readouterr().err
    assert "could not download PUPA" in err and "Traceback" not in err
