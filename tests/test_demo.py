"""The main job's code path (python -m dspy_agentgrad demo) on a rule-based fake LM."""

from __future__ import annotations

import json
import re

import pytest

from dspy_agentgrad import AgentGrad
from dspy_agentgrad.config import AgentGradConfig
from dspy_agentgrad.demo import task as demo_task
from dspy_agentgrad.demo.job import DemoSettings, run_demo
from dspy_agentgrad.demo.story import report
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
    settings = DemoSettings(
        n_train=6, n_val=6, n_test=8, max_metric_calls=80, candidates="instructions", hint_delivery="input_field"
    )
    summary = run_demo(lm, lm, settings, out=tmp_path)
    printed = capsys.readouterr().out
    assert "Held-out score (token F1, 8 examples)" in printed and "Blamed" in printed and "Tried" in printed
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["test_score"] == summary["test_score"]
    assert saved["metric_calls"] <= 80
    assert summary["rounds"] and summary["usage"]["optimizer"]["task"]["calls"] > 0
    assert summary["test_score"]["baseline"] < summary["test_score"]["optimized"]
    assert summary["blamed"] and {b["predictor"] for b in summary["blamed"]} == {"answer"}
    kept = [c for c in summary["candidates"] if c["accepted"]]
    assert kept[0]["predictor"] == "answer" and TOKEN in summary["final_instructions"]["answer"]
    assert [p["kind"] for p in summary["validations"]][:2] == ["start", "kept"]
    assert "KEPT" in printed and "answer: " in printed
    assert (tmp_path / "agentgrad" / "result.json").exists()


def test_demo_keeps_demonstrations_a_reader_follows(tmp_path, capsys):
    """A reader that ignores instructions but answers tersely once shown a terse answer in a demonstration."""
    examples = [e for split in demo_task.load_demo_data(6, 6, 8) for e in split]
    gold = {(e.question, e.evidence): e.answer for e in examples}
    evidence = {(e.question, e.passage): e.evidence for e in examples}

    def reader(call: FakeCall):
        if "current_instruction" in call.inputs:
            raise AssertionError("demonstrations need no prompt-LM call")
        if "evidence" in call.output_fields:
            return {"evidence": evidence[(call.inputs["question"], call.inputs["passage"])]}
        shown = any(len(d.get("answer", "").split()) <= 2 for d in call.demos)
        if shown or call.hint is not None:
            return {"answer": gold[(call.inputs["question"], call.inputs["evidence"])]}
        return {"answer": call.inputs["evidence"]}

    lm = fake_lm(reader)
    settings = DemoSettings(n_train=6, n_val=6, n_test=8, max_metric_calls=80, candidates="demos")
    summary = run_demo(lm, lm, settings, out=tmp_path)
    printed = capsys.readouterr().out
    assert summary["test_score"]["optimized"] == 1.0 > summary["test_score"]["baseline"]
    kept = [c for c in summary["candidates"] if c["accepted"]]
    assert kept and kept[0]["kind"] == "demos" and kept[0]["predictor"] == "answer"
    assert summary["final_demos"]["answer"] and summary["final_instructions"] == summary["initial_instructions"]
    assert "answer, demonstrations, cluster of" in printed and "demonstration(s) from its pseudo-labels" in printed
    test = summary["test_score"]
    rose = sum(a > b for a, b in zip(test["per_example"]["optimized"], test["per_example"]["baseline"]))
    assert len(test["per_example"]["baseline"]) == 8 and test["wins"] == rose > 0 and test["losses"] == 0
    assert f"higher on {rose}, lower on 0" in printed and "cannot tell it from chance" not in printed
    noisy = report({**summary, "test_score": {**test, "within_noise": True}})
    assert "under two standard errors: 8 examples cannot tell it from chance" in noisy


def test_demo_picture_is_written(tmp_path):
    pytest.importorskip("matplotlib")
    lm = fake_lm(make_reader([e for split in demo_task.load_demo_data(4, 4, 4) for e in split]))
    run_demo(lm, lm, DemoSettings(n_train=4, n_val=4, n_test=4, max_metric_calls=60), out=tmp_path)
    assert (tmp_path / "demo.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_unchanged_program_is_reported_with_the_reason(tmp_path, capsys):
    """A reader that ignores hints: every failure is a hard case, and the summary says so."""

    def stubborn(call: FakeCall):
        if "current_instruction" in call.inputs:
            return {name: "" for name in call.output_fields}
        if "evidence" in call.output_fields:
            return {"evidence": call.inputs["passage"]}
        return {"answer": call.inputs["evidence"]}

    lm = fake_lm(stubborn)
    summary = run_demo(lm, lm, DemoSettings(n_train=4, n_val=4, n_test=4, max_metric_calls=40), out=tmp_path)
    printed = capsys.readouterr().out
    assert not summary["candidates"] and summary["test_score"]["gain"] == 0
    assert "the program is unchanged" in printed and "every failure was a hard case" in printed
    assert "the same on all 4 examples" in printed and not summary["test_score"]["within_noise"]


def test_failures_are_blamed_on_the_step_that_caused_them():
    """``answer`` gets the gold answer as its hint only when its evidence holds it; a failure caused by
    wrong evidence goes to ``locate`` (the fix there is partial: the verbose reader still answers with
    the whole sentence, so it counts under ``fix_threshold``)."""
    train = demo_task.load_demo_data(6, 0, 0, seed=2)[0]
    wrong_evidence = {e.question + e.passage: i % 2 == 1 for i, e in enumerate(train)}
    by_key = {e.question + e.passage: e for e in train}

    def reader(call: FakeCall):
        if "evidence" in call.output_fields:
            ex = by_key[call.inputs["question"] + call.inputs["passage"]]
            if call.hint is None and wrong_evidence[ex.question + ex.passage]:
                return {"evidence": next(s for s in ex.passage.split(". ") if ex.answer not in s)}
            return {"evidence": ex.evidence}
        if call.hint is not None:  # copies the answer the hint gives
            return {"answer": call.hint.split("'")[1]}
        return {"answer": call.inputs["evidence"]}

    lm = fake_lm(reader)
    optimizer = AgentGrad(
        demo_task.metric,
        task_model=lm,
        prompt_model=lm,
        hint_fn=demo_task.hint,
        config=AgentGradConfig.from_options(max_rounds=1, fix_threshold=0.1),
    )
    report = optimizer.attribute(demo_task.make_program(), train)
    blamed = {name: {r.example.question + r.example.passage for r in recs} for name, recs in report.attributed.items()}
    assert blamed["locate"] == {k for k, wrong in wrong_evidence.items() if wrong}
    assert blamed["answer"] == {k for k, wrong in wrong_evidence.items() if not wrong}
    assert not report.hard_cases and report.leaked == 0


def test_demo_data_is_disjoint_and_seeded():
    train, val, test = demo_task.load_demo_data(5, 5, 5, seed=1)
    pairs = [(e.passage, e.question) for e in train + val + test]
    assert len(set(pairs)) == 15
    assert all(e.answer in e.evidence and e.evidence in e.passage for e in train + val + test)
    assert [e.question for e in demo_task.load_demo_data(5, 5, 5, seed=1)[0]] == [e.question for e in train]


def test_a_run_served_entirely_from_the_cache_says_so(tmp_path, capsys):
    """A warm DSPy cache must not pass for a run: the summary says nothing was generated."""

    lm = fake_lm(make_reader([e for split in demo_task.load_demo_data(4, 4, 4) for e in split]))
    summary = run_demo(lm, lm, DemoSettings(n_train=4, n_val=4, n_test=4, max_metric_calls=40), out=tmp_path)
    assert "Nothing was generated" not in capsys.readouterr().out
    assert "Nothing was generated: every LM reply came from DSPy's cache" in report({**summary, "lm_generations": 0})


def test_the_jobs_hint_is_shown_as_a_worked_example_that_a_copier_follows(tmp_path):
    """A reader that ignores advice but copies a demonstration of its very inputs: with the job's default hint
    delivery its failures are blamed on the step at fault, none is a hard case."""

    def copier(call: FakeCall):
        if "current_instruction" in call.inputs:
            raise AssertionError("demonstrations need no prompt-LM call")
        field = call.output_fields[0]
        same = [d for d in call.demos if all(d.get(k) == v for k, v in call.inputs.items())]
        if same:
            return {field: same[-1][field]}
        return {field: call.inputs["passage" if field == "evidence" else "evidence"]}

    summary = run_demo(fake_lm(copier), fake_lm(copier), DemoSettings(n_train=4, n_val=4, n_test=4), out=tmp_path)
    first = summary["rounds"][0]
    assert summary["settings"]["hint_delivery"] == "demo"
    assert first["failures"] == 4 and first["hard_cases"] == 0 and first["attributed"]["answer"] == 4
    assert {b["with_hint"]["answer"] for b in summary["blamed"]} <= {
        e.answer for e in demo_task.load_demo_data(4, 4, 4)[0]
    }
