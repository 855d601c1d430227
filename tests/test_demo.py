"""The main job's code path (python -m dspy_agentgrad demo) on a rule-based fake LM."""

from __future__ import annotations

import json
import re

from dspy_agentgrad import demo_task
from dspy_agentgrad.demo import run_demo
from dspy_agentgrad.fake_lm import FakeCall, fake_lm
from dspy_agentgrad.tracing import HINT_HEADER

TOKEN = "Write in lowercase and never use commas."


def writer(call: FakeCall):
    """A writer that obeys 'lowercase, no commas' only when its instruction says so (or a hint does)."""
    inputs = call.inputs
    if "current_instruction" in inputs:
        if "new_instruction" in call.output_fields:
            return {"new_instruction": inputs["current_instruction"] + " " + TOKEN}
        if "clusters" in call.output_fields:
            count = len(re.findall(r"^\[\d+\]", inputs["gradients"], flags=re.M))
            return {"clusters": [{"members": list(range(count)), "generalized_gradient": TOKEN}]}
        return {"gradient": TOKEN, "generalized_gradient": TOKEN}
    obeys = TOKEN in call.instructions or HINT_HEADER in call.instructions
    text = inputs.get("draft") or "Dear Team, Here Is The Answer, As Requested."
    if obeys:
        text = text.lower().replace(",", "")
    return {"response": text}


def test_demo_runs_end_to_end_and_reports(tmp_path, capsys):
    lm = fake_lm(writer)
    summary = run_demo(lm, lm, n_train=6, n_val=6, n_test=8, max_metric_calls=80, out=tmp_path)
    printed = capsys.readouterr().out
    assert "Held-out score" in printed and "Who was at fault" in printed
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["test_score"] == summary["test_score"]
    assert saved["metric_calls"] <= 80
    assert summary["rounds"] and summary["usage"]["optimizer"]["task"]["calls"] > 0
    # this writer is fixed by the rewrite, so the held-out score cannot drop
    assert summary["test_score"]["optimized"] >= summary["test_score"]["baseline"]
    if summary["accepted"]:
        assert TOKEN in summary["final_instructions"][summary["accepted"][0]["predictor"]]
        assert "Accepted for" in printed
    assert (tmp_path / "agentgrad" / "result.json").exists()


def test_demo_data_is_disjoint_and_seeded():
    train, val, test = demo_task.load_demo_data(5, 5, 5, seed=1)
    keys = [e.key for e in train + val + test]
    assert len(set(keys)) == 15
    assert [e.key for e in demo_task.load_demo_data(5, 5, 5, seed=1)[0]] == [e.key for e in train]
