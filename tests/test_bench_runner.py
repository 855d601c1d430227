"""The runner end to end on the fake LM: JSON + Markdown + PNG, resume, missing corpus, tables."""

import importlib.util
import json

import pytest

from benchmarks import harness, run, tables

# the [bench] extra: skipped cleanly when it is not installed
pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("bm25s", "matplotlib")),
    reason="the [bench] extra is not installed",
)


@pytest.fixture(autouse=True)
def _restore_dspy_cache():
    """Runs here repoint DSPy's global cache; give the next test the cache it had."""
    import dspy

    saved = dspy.cache
    yield
    dspy.cache = saved


ARGS = [
    "--task-lm",
    "fake",
    "--prompt-lm",
    "fake",
    "--max-metric-calls",
    "60",
    "--train",
    "8",
    "--val",
    "6",
    "--test",
    "6",
    "--num-threads",
    "2",
    "--seed",
    "0",
]


@pytest.fixture(scope="module")
def hotpot_out(tmp_path_factory):
    out = tmp_path_factory.mktemp("hotpot")
    code = run.main(
        ["--bench", "hotpotqa", "--corpus", "pooled", "--optimizers", "agentgrad,gepa,miprov2", "--out", str(out)]
        + ARGS
    )
    assert code == 0
    return out


def test_outputs_exist_and_hold_the_comparison(hotpot_out):
    results = json.loads((hotpot_out / "results.json").read_text())
    assert results["config"]["task_lm"] == "fake" and results["config"]["max_metric_calls"] == 60
    assert results["config"]["cache"] == "per-optimizer"
    block = results["benchmarks"]["hotpotqa"]
    assert block["status"] == "done" and block["info"]["corpus"] == "pooled"
    entries = block["optimizers"]
    assert list(entries) == ["baseline", "agentgrad", "gepa", "miprov2"]
    base = entries["baseline"]["test_score"]
    for name, entry in entries.items():
        assert entry["status"] == "done"
        assert entry["gain"] == pytest.approx(entry["test_score"] - base)
        assert set(entry["usage"]) >= {"task", "prompt"} and entry["usage"]["task"]["calls"] > 0
        assert set(entry["instructions"]) == {
            "summarize1.predict",
            "create_query_hop2.predict",
            "summarize2.predict",
            "final_answer.predict",
        }
        assert entry["wall_time_s"] >= 0 and entry["test_metric_calls"] == 6
        assert len(entry["test_scores"]) == 6 and sum(entry["test_scores"]) / 6 == pytest.approx(entry["test_score"])
        assert (hotpot_out / "programs" / "hotpotqa" / f"{name}.json").exists()
        if name != "baseline":
            assert entry["gain"] > 0 and entry["curve"], name
            assert entry["metric_calls"] <= 60 + 12, name
            assert entry["usage"]["prompt"]["calls"] > 0, name
            assert entry["gain_se"] is not None and entry["gain_se"] >= 0, name
    assert (hotpot_out / "cache" / "hotpotqa" / "gepa").is_dir()  # one cache dir per optimizer
    md = (hotpot_out / "results.md").read_text()
    assert "| Optimizer | HotpotQA | Avg gain |" in md
    assert "| AgentGrad |" in md and "| GEPA |" in md and "| MIPROv2 |" in md and "| Baseline |" in md
    assert "corpus = pooled" in md
    # head to head, example by example: AgentGrad against each other optimizer on the same 6 test examples
    section = md.split("### Head to head, example by example")[1].split("\n\n")[1]
    pairs = [line for line in section.splitlines() if line.startswith("| HotpotQA | ")]
    assert [line.split(" | ")[1] for line in pairs] == ["Baseline", "MIPROv2", "GEPA"]
    for line, name in zip(pairs, ["baseline", "miprov2", "gepa"]):
        higher, lower, same = (int(n) for n in line.split(" | ")[3].split(" / "))
        mine, theirs = entries["agentgrad"]["test_scores"], entries[name]["test_scores"]
        assert (higher, lower) == (sum(a > b for a, b in zip(mine, theirs)), sum(a < b for a, b in zip(mine, theirs)))
        assert higher + lower + same == 6
    assert (hotpot_out / "val_curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_rerun_resumes_without_rerunning_finished_optimizers(hotpot_out, monkeypatch):
    before = json.loads((hotpot_out / "results.json").read_text())

    def boom(*a, **k):
        raise AssertionError("a finished optimizer was run again")

    monkeypatch.setattr(run, "run_optimizer", boom)
    code = run.main(
        [
            "--bench",
            "hotpotqa",
            "--corpus",
            "pooled",
            "--optimizers",
            "agentgrad,gepa,miprov2",
            "--out",
            str(hotpot_out),
        ]
        + ARGS
    )
    assert code == 0
    after = json.loads((hotpot_out / "results.json").read_text())
    assert after["benchmarks"] == before["benchmarks"]


def test_resume_refuses_other_settings(hotpot_out):
    with pytest.raises(SystemExit, match="different settings"):
        run.main(
            ["--bench", "hotpotqa", "--corpus", "pooled", "--out", str(hotpot_out)]
            + [a if a != "60" else "61" for a in ARGS]
        )


def test_hover_without_corpus_is_reported_not_crashed(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("AGENTGRAD_OFFLINE", "1")
    monkeypatch.setenv("AGENTGRAD_CACHE_DIR", str(tmp_path / "nocache"))
    code = run.main(
        ["--bench", "hover", "--corpus", "pooled", "--optimizers", "gepa", "--out", str(tmp_path / "o")] + ARGS
    )
    assert code == 2
    results = json.loads((tmp_path / "o" / "results.json").read_text())
    assert results["benchmarks"]["hover"]["status"] == "unavailable"
    assert "HoVer needs the Wikipedia 2017 abstracts" in capsys.readouterr().err
    assert "not run" in (tmp_path / "o" / "results.md").read_text()


def test_failed_optimizer_is_recorded_and_others_continue(tmp_path, monkeypatch):
    real = harness.run_optimizer

    def flaky(name, *a, **k):
        if name == "gepa":
            raise RuntimeError("simulated failure")
        return real(name, *a, **k)

    monkeypatch.setattr(run, "run_optimizer", flaky)
    code = run.main(
        ["--bench", "ifbench", "--optimizers", "gepa,miprov2", "--out", str(tmp_path)]
        + [a if a != "6" else "5" for a in ARGS]
    )
    assert code == 2
    entries = json.loads((tmp_path / "results.json").read_text())["benchmarks"]["ifbench"]["optimizers"]
    assert entries["gepa"]["status"] == "failed" and "simulated failure" in entries["gepa"]["error"]
    assert entries["miprov2"]["status"] == "done" and entries["baseline"]["status"] == "done"
    assert 0.0 <= entries["miprov2"]["test_score"] <= 1.0


def test_tables_merge_several_result_files(hotpot_out, tmp_path):
    other = tmp_path / "ifb"
    assert (
        run.main(
            ["--bench", "ifbench", "--optimizers", "miprov2", "--out", str(other)]
            + [a if a != "6" else "5" for a in ARGS]
        )
        == 0
    )
    md = tmp_path / "t.md"
    png = tmp_path / "t.png"
    assert tables.main([str(hotpot_out / "results.json"), str(other), "--out", str(md), "--plot", str(png)]) == 0
    text = md.read_text()
    assert "| Optimizer | HotpotQA | IFBench | Avg gain |" in text
    mipro_row = next(line for line in text.splitlines() if line.startswith("| MIPROv2 |"))
    assert mipro_row.count("(") == 2  # a gain in both benchmark columns
    agentgrad_row = next(line for line in text.splitlines() if line.startswith("| AgentGrad |"))
    assert "–" in agentgrad_row  # no IFBench run for AgentGrad
    assert png.read_bytes()[:4] == b"\x89PNG"
