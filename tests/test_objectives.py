"""Objectives besides the score: a metric's ``objective_scores`` are recorded for every scored run and
candidate and shown in the result; ``objective_guards`` keeps a candidate whose guarded objective falls on
validation from being kept."""

from __future__ import annotations

import json

import dspy
import pytest
from world import Pipeline, World, make_data, world_lm

from dspy_agentgrad import AgentGrad, MetricError, write_report
from dspy_agentgrad.config import AgentGradConfig
from dspy_agentgrad.program.metric import Metric
from dspy_agentgrad.program.objectives import guard_violations, objective_means
from dspy_agentgrad.program.runs import Outcome

TRAIN = make_data({"extract": 2, "notes": 1, "answer": 1})
VAL = make_data({"extract": 1, "notes": 1, "none": 1}, start=50)
FAST = dict(auto=None, max_rounds=1, progress=False)


def two_objectives(gold, pred, trace=None, pred_name=None, pred_trace=None):
    """Correctness is the score; ``private`` is 1 while the program does not echo the question's id as its
    keyword, so the extractor's fix (which makes answers right) costs it, and the note-taker's fix does not."""
    correct = float(getattr(pred, "answer", None) == gold.answer)
    private = float(getattr(pred, "keyword", None) != gold.question.split()[0])
    return dspy.Prediction(
        score=correct,
        feedback="correct" if correct else f"expected {gold.answer}",
        objective_scores={"correct": correct, "private": private},
    )


def compile_with(tmp_path=None, **options):
    dspy.configure(lm=world_lm(World()))
    return (
        AgentGrad(two_objectives, log_dir=tmp_path, config=AgentGradConfig.from_options(**{**FAST, **options}))
        .compile(Pipeline(), trainset=TRAIN, valset=VAL)
        .detailed_results
    )


def test_objectives_are_recorded_per_candidate_and_shown_in_result_json_and_md(tmp_path):
    result = compile_with(tmp_path)
    saved = json.loads((tmp_path / "result.json").read_text())
    assert set(saved["val_objectives"]) == {"initial", "best"}
    assert saved["val_objectives"]["initial"] == pytest.approx({"correct": 1 / 3, "private": 1 / 3})
    validated = [c for c in saved["candidates"] if c["val_score"] is not None and c["objectives"]]
    assert validated and all(set(c["objectives"]) == {"correct", "private"} for c in validated)
    assert result.val_objectives["best"]["correct"] == pytest.approx(result.best_val_score)
    md = (tmp_path / "result.md").read_text()
    assert "objective private (validation mean): 0.3333 -> " in md
    html = write_report(tmp_path).read_text()
    assert "objective private (validation mean): 0.3333 &rarr; " in html


def test_objectives_go_to_mlflow_as_final_metrics(tmp_path, monkeypatch):
    mlflow = pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri((tmp_path / "mlruns").as_uri())
    try:
        result = compile_with(use_mlflow=True)
        client = mlflow.tracking.MlflowClient()
        [run] = client.search_runs([client.get_experiment_by_name("Default").experiment_id])
    finally:
        mlflow.set_tracking_uri(previous)
    metrics = run.data.metrics
    assert metrics["objective.private.initial"] == pytest.approx(1 / 3)
    assert metrics["objective.private.best"] == pytest.approx(result.val_objectives["best"]["private"])


def test_without_a_guard_the_extractor_fix_is_kept_and_the_private_objective_falls():
    result = compile_with()
    assert any(c.accepted and c.predictor == "extract" for c in result.candidates)
    assert result.val_objectives["best"]["private"] < result.val_objectives["initial"]["private"]


def test_a_guard_blocks_the_candidate_that_buys_score_with_a_guarded_objective():
    result = compile_with(objective_guards={"private": 0.0}, max_rounds=3)
    extract = [c for c in result.candidates if c.predictor == "extract" and c.val_score is not None]
    assert extract and not any(c.accepted for c in extract)
    assert all(c.reason.startswith("a guarded objective fell on validation: private") for c in extract)
    assert result.val_objectives["best"]["private"] >= result.val_objectives["initial"]["private"]
    assert "FIX-extract" not in result.final_instructions["extract"]
    assert any(c.accepted and c.predictor == "notes" for c in result.candidates)  # a gain that costs nothing stays


def test_a_tolerance_as_wide_as_the_fall_lets_the_candidate_through():
    result = compile_with(objective_guards={"private": 0.34})  # the fix costs 1/3 of validation's private
    assert any(c.accepted and c.predictor == "extract" for c in result.candidates)


def test_a_guard_on_an_objective_the_metric_never_reports_is_an_error_naming_the_reported_ones():
    with pytest.raises(ValueError, match=r"objective_guards names \['privacy'\].*reports: correct, private"):
        compile_with(objective_guards={"privacy": 0.0})


@pytest.mark.parametrize("bad", [{}, {"private": -0.1}, {"private": "0"}, ["private"], {"private": float("inf")}])
def test_bad_guards_are_refused_at_construction(bad):
    with pytest.raises(ValueError, match="objective_guards"):
        AgentGrad(two_objectives, config=AgentGradConfig.from_options(objective_guards=bad))


def test_objective_scores_in_a_dict_or_a_prediction_are_parsed_and_bad_ones_refused():
    metric = Metric(lambda ex, pred: {"score": 1, "objective_scores": {"a": 0.5}})
    assert metric(None, None).objectives == {"a": 0.5}
    assert Metric(lambda ex, pred: 1.0)(None, None).objectives == {}
    with pytest.raises(MetricError, match="objective_scores"):
        Metric(lambda ex, pred: dspy.Prediction(score=1, objective_scores={"a": "high"}))(None, None)


def test_objectives_survive_the_journal_and_a_failed_run_counts_zero():
    outcome = Outcome(1.0, objectives={"a": 0.5})
    assert Outcome.from_dict(json.loads(json.dumps(outcome.to_dict()))).objectives == {"a": 0.5}
    assert "objectives" not in Outcome(1.0).to_dict()  # journals without objectives are unchanged
    assert objective_means([{"a": 1.0, "b": 1.0}, {}]) == {"a": 0.5, "b": 0.5}
    assert guard_violations({"a": 0.1}, {"a": 0.5}, {"a": 0.45}) == []
    assert guard_violations({"a": 0.1}, {"a": 0.5}, {"a": 0.35}) == ["a 0.5000 -> 0.3500 (tolerance 0.1)"]
