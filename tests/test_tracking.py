"""``use_mlflow=True`` against a real local MLflow file store (no server); skipped without mlflow."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import dspy
import pytest
from world import Pipeline, World, feedback_metric, make_data, world_lm

from dspy_agentgrad import AgentGrad
from dspy_agentgrad.config import AgentGradConfig
from dspy_agentgrad.testing import fake_lm

mlflow = pytest.importorskip("mlflow")

FAST = dict(progress=False)


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
    agent = AgentGrad(
        feedback_metric,
        auto=None,
        use_mlflow=True,
        config=AgentGradConfig.from_options(max_rounds=3, **FAST, **options),
    )
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
    artifacts = {a.path for a in store.list_artifacts(run.info.run_id, "agentgrad")}
    assert artifacts == {
        "agentgrad/result.json",
        "agentgrad/result.md",
        "agentgrad/report.html",
        "agentgrad/optimized_program.json",
        "agentgrad/candidates.json",
        "agentgrad/validation_examples.json",
    }
    logged = json.loads(open(store.download_artifacts(run.info.run_id, "agentgrad/result.json")).read())
    assert logged["final_instructions"] == result.final_instructions


def test_every_metric_is_stepped_by_metric_calls(store):
    """One step unit on every chart: a round's blame is logged at the metric calls spent when it was
    decided (from the previous round's end to its own), with the round as a metric."""
    result = compile_once()
    [run] = runs(store)

    def history(key):
        return store.get_metric_history(run.info.run_id, key)

    blamed, rounds = history("attributed.extract"), history("round")
    assert [m.value for m in blamed] == [r.attributed["extract"] for r in result.rounds]
    assert [m.value for m in rounds] == [r.round for r in result.rounds]
    ends = [0] + [r.metric_calls for r in result.rounds]  # a round may reuse every run: then no call is spent
    assert blamed[0].step > 0 and all(ends[i] <= m.step <= ends[i + 1] for i, m in enumerate(blamed))
    assert [m.step for m in rounds] == [m.step for m in blamed]
    for key in run.data.metrics:
        assert all(0 < m.step <= result.metric_calls for m in history(key)), key


def test_lm_names_usage_cost_and_tables_are_logged(store):
    """A priced model name gets a cost; the candidate and per-example tables hold the result's rows."""
    dspy.configure(lm=fake_lm(World(), name="openai/gpt-4o-mini"))
    result = compile_once()
    [run] = runs(store)
    assert run.data.params["agentgrad.task_lm"] == run.data.params["agentgrad.prompt_lm"] == "openai/gpt-4o-mini"
    metrics = run.data.metrics
    for role in ("task", "prompt"):
        for key in ("calls", "prompt_tokens", "completion_tokens"):
            assert metrics[f"lm.{role}.{key}"] == result.usage[role][key] > 0
        assert metrics[f"lm.{role}.cost_usd"] > 0
    table = json.loads(open(store.download_artifacts(run.info.run_id, "agentgrad/candidates.json")).read())
    rows = [dict(zip(table["columns"], row)) for row in table["data"]]
    assert [(r["predictor"], r["verdict"].split(":")[0]) for r in rows] == [
        (c.predictor, "accepted" if c.accepted else "rejected") for c in result.candidates
    ]
    assert all(r["gradient"] for r in rows)
    table = json.loads(open(store.download_artifacts(run.info.run_id, "agentgrad/validation_examples.json")).read())
    rows = [dict(zip(table["columns"], row)) for row in table["data"]]
    assert len(rows) == 8 and [r["best_score"] for r in rows] == [v.best for v in result.val_examples]
    assert sum(r["best_score"] for r in rows) / 8 == pytest.approx(result.best_val_score)


def test_an_unpriced_lm_gets_no_cost_metric(store):
    compile_once()
    [run] = runs(store)
    assert "lm.task.calls" in run.data.metrics and "lm.task.cost_usd" not in run.data.metrics


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


def test_autolog_called_before_agentgrad_is_imported_still_logs_the_compile(store, tmp_path):
    """autolog patches the optimizers that exist when it is called; importing AgentGrad repeats it. Without
    use_mlflow, a compile under autolog(log_compiles=True) is logged too: autolog's artifacts and ours."""
    script = textwrap.dedent(
        f"""
        import mlflow
        mlflow.set_tracking_uri({mlflow.get_tracking_uri()!r})
        mlflow.set_experiment("agentgrad-test")
        mlflow.dspy.autolog(log_compiles=True)
        import dspy
        from dspy_agentgrad import AgentGrad  # after autolog
        from dspy_agentgrad.config import AgentGradConfig
        from world import Pipeline, World, feedback_metric, make_data, world_lm
        dspy.configure(lm=world_lm(World()))
        train = make_data({{"extract": 3, "notes": 3, "answer": 3, "none": 3}})
        val = make_data({{"extract": 2, "notes": 2, "answer": 2, "none": 2}}, start=100)
        agent = AgentGrad(feedback_metric, auto=None, config=AgentGradConfig.from_options(max_rounds=1, progress=False))
        agent.compile(Pipeline(), trainset=train, valset=val)
        """
    )
    tests = Path(__file__).parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tests.parent), str(tests)])}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    [run] = runs(store)
    assert run.info.status == "FINISHED" and "best_val_score" in run.data.metrics
    logged = {a.path for a in store.list_artifacts(run.info.run_id)}
    assert {"best_model.json", "agentgrad"} <= logged
