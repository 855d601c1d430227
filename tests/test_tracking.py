"""``use_mlflow=True`` against a real local MLflow file store (no server); skipped without mlflow."""

from __future__ import annotations

import json

import dspy
import pytest
from world import Pipeline, World, feedback_metric, make_data, world_lm

from dspy_agentgrad import AgentGrad

mlflow = pytest.importorskip("mlflow")

FAST = dict(retry_backoff_s=0, progress=False)


@pytest.fixture
def store(tmp_path, monkeypatch):
    """A fresh file store as the tracking URI; no run left active afterwards."""
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3.x steers new users to sqlite
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri((tmp_path / "mlruns").as_uri())
    mlflow.set_experiment("agentgrad-test")
    dspy.configure(lm=world_lm(World()))
    yield mlflow.tracking.MlflowClient()
    while mlflow.active_run() is not None:
        mlflow.end_run()
    mlflow.set_tracking_uri(previous)


def compile_once(**options):
    train = make_data({"extract": 3, "notes": 3, "answer": 3, "none": 3})
    val = make_data({"extract": 2, "notes": 2, "answer": 2, "none": 2}, start=100)
    agent = AgentGrad(feedback_metric, auto=None, max_rounds=3, use_mlflow=True, **FAST, **options)
    return agent.compile(Pipeline(), trainset=train, valset=val).detailed_results


def runs(client):
    experiment = client.get_experiment_by_name("agentgrad-test")
    return client.search_runs([experiment.experiment_id])


def test_the_compile_is_one_finished_run_with_params_metrics_and_artifacts(store):
    result = compile_once(seed=7)
    [run] = runs(store)
    assert run.info.status == "FINISHED"
    params = run.data.params
    assert params["agentgrad.seed"] == "7" and params["agentgrad.max_rounds"] == "3"
    assert params["agentgrad.predictors"] == "answer, extract, notes"
    metrics = run.data.metrics
    assert metrics["best_val_score"] == result.best_val_score
    assert metrics["metric_calls"] == result.metric_calls
    assert metrics["candidates_accepted"] == len(result.accepted)
    assert metrics["candidates_rejected"] == len(result.rejected)
    history = store.get_metric_history(run.info.run_id, "best_val_score")
    assert [(m.step, m.value) for m in history][0] == (result.val_history[0][0], result.initial_val_score)
    assert {m.step for m in history} >= {calls for calls, _ in result.val_history}
    blamed = store.get_metric_history(run.info.run_id, "attributed.extract")
    assert [(m.step, m.value) for m in blamed] == [(r.round, r.attributed["extract"]) for r in result.rounds]
    artifacts = {a.path for a in store.list_artifacts(run.info.run_id, "agentgrad")}
    assert artifacts == {
        "agentgrad/result.json",
        "agentgrad/result.md",
        "agentgrad/report.html",
        "agentgrad/optimized_program.json",
    }
    logged = json.loads(open(store.download_artifacts(run.info.run_id, "agentgrad/result.json")).read())
    assert logged["final_instructions"] == result.final_instructions


def test_an_active_run_is_reused_not_duplicated(store):
    with mlflow.start_run(run_name="mine") as outer:
        compile_once()
        assert mlflow.active_run().info.run_id == outer.info.run_id  # still open: it is the user's
    [run] = runs(store)
    assert run.info.run_name == "mine" and "best_val_score" in run.data.metrics


def test_under_dspy_autolog_the_compile_is_logged_once(store):
    mlflow.dspy.autolog(log_compiles=True)
    try:
        result = compile_once()
    finally:
        mlflow.dspy.autolog(disable=True)
    [run] = runs(store)
    assert run.data.metrics["best_val_score"] == result.best_val_score
    assert "agentgrad.seed" in run.data.params
    logged = {a.path for a in store.list_artifacts(run.info.run_id)}
    assert {"best_model.json", "agentgrad"} <= logged  # autolog's artifact and ours, in the one run
