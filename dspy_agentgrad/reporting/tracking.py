"""Experiment tracking with MLflow: ``AgentGrad(..., use_mlflow=True)``, or ``mlflow.dspy.autolog(log_compiles=True)``.

The run goes to the active tracking URI (``mlflow.set_tracking_uri`` or
``MLFLOW_TRACKING_URI``). When an MLflow run is already active, for example the
one ``mlflow.dspy.autolog(log_compiles=True)`` opens around ``compile``, AgentGrad
logs into it instead of opening a second run, so a compile shows up once; under that
autolog AgentGrad logs even without ``use_mlflow``.

Every metric's step is the number of metric calls spent so far (one unit for every chart).
Logged: the options, the LM names and the run's sizes as params; the validation score
(each candidate's and the best so far), accepted and rejected counts, failures attributed
per predictor (with the round), and at the end LM calls, tokens and cost per role as
metrics; tables of the candidates (gradient, rewrite, scores, verdict) and of the best
program's per-example validation scores; ``result.json``, ``result.md``, ``report.html``
and the optimized program as artifacts under ``agentgrad/``.

``mlflow.dspy.autolog()`` patches the optimizer classes that exist when it is called, so
an AgentGrad imported after it would be missed: importing AgentGrad therefore repeats an
earlier autolog call (:func:`follow_dspy_autolog`), whatever the import order.

``mlflow`` is an optional extra: ``pip install 'dspy-agentgrad[mlflow]'``.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..core.events import AttributionDone, CandidateJudged, RunEnd, RunStart, ValidationScored
from ..runtime.pricing import price_function
from ..runtime.redaction import Redactor
from .observers import VerdictCounts
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


def _dspy_autolog_config() -> dict | None:
    """The arguments of the last ``mlflow.dspy.autolog()`` call when it is on; None when mlflow is not
    imported (then autolog was never called) or autolog is off."""
    if "mlflow" not in sys.modules:
        return None
    try:
        from mlflow.utils.autologging_utils import AUTOLOGGING_INTEGRATIONS, autologging_is_disabled
    except ImportError:  # another MLflow layout: nothing to follow
        return None
    config = AUTOLOGGING_INTEGRATIONS.get("dspy")
    return dict(config) if config and not autologging_is_disabled("dspy") else None


def follow_dspy_autolog() -> None:
    """Repeat an earlier ``mlflow.dspy.autolog()`` call so that it also patches AgentGrad (which did not
    exist when it ran). Called once, when AgentGrad is defined; a later autolog call finds AgentGrad itself."""
    config = _dspy_autolog_config()
    if config is not None:
        import mlflow.dspy

        mlflow.dspy.autolog(**config)


def autolog_logs_compiles() -> bool:
    """Whether ``mlflow.dspy.autolog(log_compiles=True)`` is on: then a compile is tracked without ``use_mlflow``."""
    config = _dspy_autolog_config()
    return bool(config and config.get("log_compiles"))


def lm_name(lm: Any) -> str:
    """An LM's model name as params show it."""
    return str(getattr(lm, "model", None) or type(lm).__name__)


def candidate_rows(result: AgentGradResult) -> dict[str, list]:
    """One row per judged rewrite: where it came from, what it said, how it scored, and the verdict."""
    columns = ("round", "predictor", "cluster_size", "gradient", "instruction", "cluster_score_before")
    columns += ("cluster_score_after", "val_score", "metric_calls")
    rows: dict[str, list] = {name: [getattr(c, name) for c in result.candidates] for name in columns}
    rows["verdict"] = ["accepted" if c.accepted else f"rejected: {c.reason}" for c in result.candidates]
    return rows


def val_example_rows(result: AgentGradResult) -> dict[str, list]:
    """One row per validation example: its score with the starting program and with the best one."""
    return {
        "example": [v.example for v in result.val_examples],
        "initial_score": [v.initial for v in result.val_examples],
        "best_score": [v.best for v in result.val_examples],
    }


def metric_key(text: str) -> str:
    """MLflow metric names allow letters, digits and ``_-./ ``; anything else becomes ``_``."""
    return "".join(ch if ch.isalnum() or ch in "_-./ " else "_" for ch in text)


class MlflowTracker(VerdictCounts):
    """Logs one AgentGrad compile to MLflow as the engine's events arrive.

    ``lms`` maps each role ("task", "prompt") to its LM, for names and prices. ``snapshot()``
    returns the result so far and ``optimized(result)`` the optimized program; both are called
    once, at the end of the run, for the artifacts. ``redact`` keeps credentials out of the
    program's copy, as out of ``log_dir``'s.
    """

    def __init__(
        self,
        options: dict[str, Any],
        lms: dict[str, Any],
        snapshot: Callable[[], AgentGradResult],
        optimized: Callable[[AgentGradResult], Any],
        redact: Redactor,
    ):
        super().__init__()
        self.redact = redact
        self.mlflow = import_mlflow()
        self.options = options
        self.lms = lms
        self.snapshot = snapshot
        self.optimized = optimized
        self.own_run = False

    def on_run_start(self, event: RunStart) -> None:
        mlflow = self.mlflow
        if mlflow.active_run() is None:
            mlflow.start_run(run_name="agentgrad")
            self.own_run = True
        params = {f"agentgrad.{k}": str(v)[:MAX_PARAM_CHARS] for k, v in self.options.items()}
        params.update({f"agentgrad.{role}_lm": lm_name(lm)[:MAX_PARAM_CHARS] for role, lm in self.lms.items()})
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
        metrics.update({"round": event.round, "failures": event.failures})
        metrics["hard_cases"] = len(event.report.hard_cases)
        self.mlflow.log_metrics(metrics, step=event.metric_calls)

    def on_verdict(self, event: CandidateJudged) -> None:
        self.mlflow.log_metrics(self.verdict_counts(), step=event.metric_calls)

    def usage_metrics(self, result: AgentGradResult) -> dict[str, float]:
        """LM calls and tokens per role, and its cost in USD where litellm's price table knows the model."""
        metrics: dict[str, float] = {}
        for role, lm in self.lms.items():
            usage = result.usage.get(role) or {}
            metrics.update({f"lm.{role}.{key}": value for key, value in usage.items()})
            try:
                metrics[f"lm.{role}.cost_usd"] = price_function(lm)(usage)
            except ValueError:  # no price for this model (a local or fake LM)
                pass
        return metrics

    def log_tables(self, result: AgentGradResult) -> None:
        """The candidates and the per-example validation scores, as MLflow tables."""
        self.mlflow.log_table(candidate_rows(result), f"{ARTIFACT_DIR}/candidates.json")
        if result.val_examples:
            self.mlflow.log_table(val_example_rows(result), f"{ARTIFACT_DIR}/validation_examples.json")

    def on_run_end(self, event: RunEnd) -> None:
        mlflow = self.mlflow
        try:
            mlflow.set_tag("agentgrad.stop_reason", event.stop_reason[:MAX_PARAM_CHARS])
            result = self.snapshot()
            final = {"metric_calls": event.metric_calls, "rounds": event.rounds, **self.usage_metrics(result)}
            final.update(self.verdict_counts())
            if event.best_score is not None:
                final["best_val_score"] = event.best_score
            for name, initial, best in result.objective_changes():
                key = f"objective.{metric_key(name)}"
                final.update({f"{key}.initial": initial, f"{key}.best": best})
            mlflow.log_metrics(final, step=event.metric_calls)
            self.log_tables(result)
            mlflow.log_dict(result.to_dict(), f"{ARTIFACT_DIR}/result.json")
            mlflow.log_text(result.to_markdown(), f"{ARTIFACT_DIR}/result.md")
            mlflow.log_text(render_html(result), f"{ARTIFACT_DIR}/report.html")
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / "optimized_program.json"
                self.redact.save(self.optimized(result), path)
                mlflow.log_artifact(str(path), ARTIFACT_DIR)
        finally:
            if self.own_run:
                mlflow.end_run(status="KILLED" if event.interrupted else "FINISHED")
