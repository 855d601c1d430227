"""``--table ablation|transfer|time``: fake-LM dry runs produce each of the paper's other tables, with the
paper's numbers beside ours where the paper gives them."""

from __future__ import annotations

import importlib.util
import json

import dspy
import pytest

from benchmarks import run
from benchmarks.paper_tables import wall_clock

needs_math = pytest.mark.skipif(importlib.util.find_spec("math_verify") is None, reason="the [math] extra is missing")
SMALL = ["--task-lm", "fake", "--prompt-lm", "fake", "--max-metric-calls", "40", "--train", "6", "--val", "6"]
SMALL += ["--test", "6", "--num-threads", "2"]


@pytest.fixture(autouse=True)
def _restore_dspy_cache():
    saved = dspy.cache
    yield
    dspy.cache = saved


@needs_math
def test_ablation_table_has_the_papers_four_rows(tmp_path):
    assert run.main(["--bench", "math", "--table", "ablation", *SMALL, "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    entries = results["benchmarks"]["math"]["optimizers"]
    assert list(entries) == ["baseline", "agentgrad-plain", "agentgrad+target", "agentgrad+supervision", "agentgrad"]
    switches = ("target_identification", "agent_supervision", "semantic_abstraction")
    reached = {n: tuple(entries[n]["details"]["result"]["options"][k] for k in switches) for n in list(entries)[1:]}
    assert reached == {  # each row adds one component, as the paper's rows do
        "agentgrad-plain": (False, False, False),
        "agentgrad+target": (True, False, False),
        "agentgrad+supervision": (True, True, False),
        "agentgrad": (True, True, True),
    }
    table = json.loads((tmp_path / "ablation.json").read_text())
    assert set(table["rows"]) == {"agentgrad-plain", "agentgrad+target", "agentgrad+supervision", "agentgrad"}
    assert table["rows"]["agentgrad"]["math"] == entries["agentgrad"]["test_score"]
    md = (tmp_path / "ablation.md").read_text()
    for label in ("Plain textual gradients", "+ Target identification", "+ Agent-level supervision", "full AgentGrad"):
        assert label in md
    assert "| Variant | MATH |" in md and "gives no numbers" in md


def test_transfer_pupa_to_pupa_tnb_evaluates_the_optimized_program_unchanged(tmp_path):
    args = ["--bench", "pupa", "--table", "transfer", "--optimizers", "gepa", *SMALL, "--out", str(tmp_path)]
    assert run.main(args) == 0
    block = json.loads((tmp_path / "results.json").read_text())["benchmarks"]["pupa"]
    transfer = block["transfer"]
    assert transfer["target"] == "pupa-tnb" and transfer["status"] == "done" and transfer["info"]["size"] == 6
    for name in ("baseline", "gepa"):
        score = transfer["scores"][name]
        assert 0.0 <= score["target"] <= 1.0 and score["target_metric_calls"] == 6
        assert score["source_test"] == block["optimizers"][name]["test_score"]
    md = (tmp_path / "transfer.md").read_text()
    assert "PUPA → PUPA-TNB" in md and "(paper +2.87)" in md and "| GEPA |" in md


def test_transfer_to_2wiki_offline_is_a_clear_error(tmp_path, monkeypatch, capsys):
    pytest.importorskip("bm25s", reason="HotpotQA's retriever needs the [bench] extra")
    monkeypatch.setenv("AGENTGRAD_OFFLINE", "1")
    monkeypatch.setenv("AGENTGRAD_CACHE_DIR", str(tmp_path / "cache"))
    args = ["--bench", "hotpotqa", "--corpus", "pooled", "--table", "transfer", "--optimizers", "baseline", *SMALL]
    assert run.main([*args, "--out", str(tmp_path / "o")]) == 2
    assert "2WikiMultiHopQA is not cached" in capsys.readouterr().err
    md = (tmp_path / "o" / "transfer.md").read_text()
    assert "HotpotQA → 2WikiMultiHopQA" in md and "not run" in md
    block = json.loads((tmp_path / "o" / "results.json").read_text())["benchmarks"]["hotpotqa"]
    assert block["optimizers"] == {}  # nothing optimized for a transfer that cannot be evaluated


def test_transfer_refuses_a_source_without_target(tmp_path):
    with pytest.raises(SystemExit, match="source benchmarks with a target are pupa, hotpotqa"):
        run.main(["--bench", "ifbench", "--table", "transfer", *SMALL, "--out", str(tmp_path)])


@needs_math
def test_time_table_from_the_runs_own_records(tmp_path):
    args = ["--bench", "math", "--table", "time", "--optimizers", "agentgrad,gepa", *SMALL, "--out", str(tmp_path)]
    assert run.main(args) == 0
    entries = json.loads((tmp_path / "results.json").read_text())["benchmarks"]["math"]["optimizers"]
    table = json.loads((tmp_path / "time.json").read_text())
    assert table["minutes"]["math"]["gepa"] == pytest.approx(entries["gepa"]["wall_time_s"] / 60)
    assert "baseline" not in table["minutes"]["math"]  # not an optimizer run
    md = (tmp_path / "time.md").read_text()
    assert "| AgentGrad |" in md and "(88)" in md and "(136)" in md and "| GEPA |" in md


def test_time_ratios_and_paper_cells():
    results = {
        "benchmarks": {
            "hotpotqa": {
                "optimizers": {
                    "agentgrad": {"status": "done", "wall_time_s": 600},
                    "gepa": {"status": "done", "wall_time_s": 1800},
                    "miprov2": {"status": "failed", "wall_time_s": 5},
                }
            }
        }
    }
    data, md = wall_clock(results)
    assert data["time_over_agentgrad"]["hotpotqa"] == {"agentgrad": 1.0, "gepa": 3.0}
    assert "| GEPA | 3.00x (3.2x) |" in md and "MIPROv2" not in md
