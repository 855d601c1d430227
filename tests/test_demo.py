"""The main job's code path (python -m dspy_agentgrad demo) on a rule-based fake LM."""

from __future__ import annotations

import json
import re

from dspy_agentgrad.demo import task as demo_task
from dspy_agentgrad.demo.job import run_demo
from dspy_agentgrad.testing import FakeCall, fake_lm

TOKEN = "Reply with only the words that answer the question."


def make_reader(examples):
    """A verbose reader: it quotes the right evidence, but answers with the whole sentence unless its
    instruction (or a hint) asks for only the answering words; the prompt-LM roles propose exactly that."""
    gold = {(e.question, e.evidence): e.answer for e in examples}
    evidence = {(e.question, e.passage): e.evidence for e in examples}

    def reader(call: FakeCall):
        inputs = call.inputs
        if "current_instruction" in inputs:
            if "new_instruction" in call.output_fields:
                return {"new_instruction": inputs["current_instruction"] + " " + TOKEN}
            if "clusters" in call.output_fields:
                count = len(re.findall(r"^\[\d+\]", inputs["gradients"], flags=re.M))
                return {"clusters": [{"members": list(range(count)), "generalized_gradient": TOKEN}]}
            return {"gradient": TOKEN, "generalized_gradient": TOKEN}
        if "evidence" in call.output_fields:
            return {"evidence": evidence[(inputs["question"], inputs["passage"])]}
        if TOKEN in call.instructions or call.hint is not None:
            return {"answer": gold[(inputs["question"], inputs["evidence"])]}
        return {"answer": inputs["evidence"]}

    return reader


def test_demo_runs_end_to_end_and_reports(tmp_path, capsys):
    lm = fake_lm(make_reader([e for split in demo_task.load_demo_data(6, 6, 8) for e in split]))
    summary = run_demo(lm, lm, n_train=6, n_val=6, n_test=8, max_metric_calls=80, out=tmp_path)
    printed = capsys.readouterr().out
    assert "Held-out score" in printed and "Who was at fault" in printed
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["test_score"] == summary["test_score"]
    assert saved["metric_calls"] <= 80
    assert summary["rounds"] and summary["usage"]["optimizer"]["task"]["calls"] > 0
    assert summary["test_score"]["baseline"] < summary["test_score"]["optimized"]
    accepted = summary["accepted"][0]
    assert accepted["predictor"] == "answer" and TOKEN in summary["final_instructions"]["answer"]
    assert "Accepted for 'answer'" in printed
    assert (tmp_path / "agentgrad" / "result.json").exists()


def test_demo_data_is_disjoint_and_seeded():
    train, val, test = demo_task.load_demo_data(5, 5, 5, seed=1)
    pairs = [(e.passage, e.question) for e in train + val + test]
    assert len(set(pairs)) == 15
    assert all(e.answer in e.evidence and e.evidence in e.passage for e in train + val + test)
    assert [e.question for e in demo_task.load_demo_data(5, 5, 5, seed=1)[0]] == [e.question for e in train]
