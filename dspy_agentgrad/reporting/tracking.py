"""Experiment tracking with MLflow: ``AgentGrad(..., use_mlflow=True)``.

The run goes to the active tracking URI (``mlflow.set_tracking_uri`` or
``MLFLOW_TRACKING_URI``). When an MLflow run is already active, for example the
one ``mlflow.dspy.autolog(log_compiles=True)`` opens around ``compile``, AgentGrad
logs into it instead of opening a second run, so a compile shows up once. Logged:
the options as params; the validation score (each candidate's and the best so far)
against metric calls, accepted and rejected counts, and failures attributed per
predictor per round as metrics; ``result.json``, ``result.md``, ``report.html`` and
the optimized program as artifacts under ``agentgrad/``.

``mlflow`` is an optional extra: ``pip install 'dspy-agentgrad[mlflow]'``.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..core.events import AgentGradCallback, AttributionDone, CandidateJudged, RunEnd, RunStart, ValidationScored
from .report import render_html
from .results import AgentGradResult

ARTIFACT_DIR = "agentgrad"
MAX_PARAM_CHARS = 500


def import_mlflow():
    """The mlflow module, or an ImportError that names the extra to install."""
    try:
        import mlflow
    except ImportError:
        raise ImportError(
            "use_mlflow=True needs MLflow: pip install 'dspy-agentgrad[mlflow]' (or pip install mlflow)"
        ) from None
    return mlflow


def metric_key(text: str) -> str:
    """MLflow metric names allow letters, digits and ``_-./ ``; anything else becomes ``_``."""
    return "".join(ch if ch.isalnum() or ch in "_-./ " else "_" for ch in text)


class MlflowTracker(AgentGradCallback):
    """Logs one AgentGrad compile to MLflow as the engine's events arrive.

    ``snapshot()`` returns the result so far and ``optimized(result)`` the optimized
    program; both are called once, at the end of the run, for the artifacts.
    """

    def __init__(
        self,
        options: dict[str, Any],
        snapshot: Callable[[], AgentGradResult],
        optimized: Callable[[AgentGradResult], Any],
    ):
        self.mlflow = import_mlflow()
        self.options = options
        self.snapshot = snapshot
        self.optimized = optimized
        self.own_run = False
        self.accepted = 0
        self.rejected = 0

    def on_run_start(self, event: RunStart) -> None:
        mlflow = self.mlflow
        if mlflow.active_run() is None:
            mlflow.start_run(run_name="agentgrad")
            self.own_run = True
        params = {f"agentgrad.{k}": str(v)[:MAX_PARAM_CHARS] for k, v in self.options.items()}
        params.update(
            {
                "agentgrad.predictors": ", ".join(event.predictors)[:MAX_PARAM_CHARS],
                "agentgrad.n_train": event.n_train,
                "agentgrad.n_val": event.n_val,
                "agentgrad.resumed": event.resumed,
            }
        )
        mlflow.log_params(params)
        mlflow.set_tag("optimizer", "AgentGrad")

    def on_validation_scored(self, event: ValidationScored) -> None:
        metrics = {"best_val_score": event.best_score}
        metrics["candidate_val_score" if event.candidate is not None else "initial_val_score"] = event.score
        self.mlflow.log_metrics(metrics, step=event.metric_calls)

    def on_attribution(self, event: AttributionDone) -> None:
        metrics = {f"attributed.{metric_key(name)}": n for name, n in event.report.counts().items()}
        metrics["failures"] = event.failures
        metrics["hard_cases"] = len(event.report.hard_cases)
        self.mlflow.log_metrics(metrics, step=event.round)

    def _judged(self, event: CandidateJudged) -> None:
        counts = {"candidates_accepted": self.accepted, "candidates_rejected": self.rejected}
        self.mlflow.log_metrics(counts, step=event.metric_calls)

    def on_candidate_accepted(self, event: CandidateJudged) -> None:
        self.accepted += 1
        self._judged(event)

    def on_candidate_rejected(self, event: CandidateJudged) -> None:
        self.rejected += 1
        self._judged(event)

    def on_run_end(self, event: RunEnd) -> None:
        mlflow = self.mlflow
        try:
            mlflow.set_tag("agentgrad.stop_reason", event.stop_reason[:MAX_PARAM_CHARS])
            final = {"metric_calls": event.metric_calls, "rounds": event.rounds}
            final.update({"candidates_accepted": self.accepted, "candidates_rejected": self.rejected})
            if event.best_score is not None:
                final["best_val_score"] = event.best_score
            mlflow.log_metrics(final, step=event.metric_calls)
            result = self.snapshot()
            mlflow.log_dict(result.to_dict(), f"{ARTIFACT_DIR}/result.json")
            mlflow.log_text(result.to_markdown(), f"{ARTIFACT_DIR}/result.md")
            mlflow.log_text(render_html(result), f"{ARTIFACT_DIR}/report.html")
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / "optimized_program.json"
                self.optimized(result).save(str(path))
                mlflow.log_artifact(str(path), ARTIFACT_DIR)
        finally:
            if self.own_run:
                mlflow.end_run(status="KILLED" if event.interrupted else "FINISHED")
