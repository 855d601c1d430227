"""Experiment tracking with Weights & Biases: ``AgentGrad(..., use_wandb=True)``, as ``dspy.GEPA`` offers it.

When a wandb run is active already (``wandb.init`` called by you), AgentGrad logs into it;
otherwise it opens one with ``wandb_init_kwargs`` and finishes it at the end. Every chart's
x axis is metric calls (``metric_calls``). Logged: the options as the run's config; the
validation score (the starting program's, each validated candidate's, the best so far);
per round the failures, hard cases and failures blamed on each predictor; the accepted and
rejected counts; at the end a ``candidates`` table (round, predictor, gradient, instruction,
scores, verdict) and the stop reason in the summary. Offline mode (``WANDB_MODE=offline``)
works as usual.

``wandb`` is an optional extra: ``pip install 'dspy-agentgrad[wandb]'``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..core.events import CandidateJudged, RoundEnd, RunEnd, RunStart, ValidationScored
from .observers import VerdictCounts
from .results import AgentGradResult

CANDIDATE_COLUMNS = [
    "round",
    "predictor",
    "cluster_size",
    "gradient",
    "instruction",
    "cluster_score_before",
    "cluster_score_after",
    "val_score",
    "accepted",
    "reason",
]


def import_wandb():
    try:
        import wandb
    except ImportError:
        raise ImportError(
            "use_wandb=True needs Weights & Biases: pip install 'dspy-agentgrad[wandb]' (or pip install wandb)"
        ) from None
    return wandb


@dataclass
class WandbSettings:
    """GEPA's three wandb options: ``use_wandb``, ``wandb_api_key`` and ``wandb_init_kwargs``."""

    enabled: bool = False
    api_key: str | None = field(default=None, repr=False)
    init_kwargs: dict[str, Any] = field(default_factory=dict)


class WandbTracker(VerdictCounts):
    """Logs one AgentGrad compile to wandb as the engine's events arrive; ``snapshot()`` gives the result."""

    def __init__(self, settings: WandbSettings, options: dict[str, Any], snapshot: Callable[[], AgentGradResult]):
        super().__init__()
        self.wandb = import_wandb()
        self.settings = settings
        self.options = options
        self.snapshot = snapshot
        self.run: Any = None
        self.own_run = False

    def on_run_start(self, event: RunStart) -> None:
        wandb = self.wandb
        if self.settings.api_key:
            wandb.login(key=self.settings.api_key, verify=False)
        self.run = wandb.run
        if self.run is None:
            self.run = wandb.init(**{"name": "agentgrad", **self.settings.init_kwargs})
            self.own_run = True
        config = {**self.options, "predictors": event.predictors, "n_train": event.n_train, "n_val": event.n_val}
        self.run.config.update({f"agentgrad.{k}": v for k, v in config.items()}, allow_val_change=True)
        self.run.define_metric("metric_calls")
        self.run.define_metric("agentgrad/*", step_metric="metric_calls")

    def _log(self, metric_calls: int, values: dict[str, Any]) -> None:
        self.run.log({"metric_calls": metric_calls, **{f"agentgrad/{k}": v for k, v in values.items()}})

    def on_validation_scored(self, event: ValidationScored) -> None:
        which = "candidate_val_score" if event.candidate is not None else "initial_val_score"
        self._log(event.metric_calls, {which: event.score, "best_val_score": event.best_score})

    def on_round_end(self, event: RoundEnd) -> None:
        r = event.record
        values: dict[str, Any] = {"round": r.round, "failures": r.failures, "hard_cases": r.hard_cases}
        values.update({f"attributed/{name}": n for name, n in r.attributed.items()})
        self._log(r.metric_calls, values)

    def on_verdict(self, event: CandidateJudged) -> None:
        self._log(event.metric_calls, self.verdict_counts())

    def on_run_end(self, event: RunEnd) -> None:
        try:
            result = self.snapshot()
            rows = [[getattr(c, column) for column in CANDIDATE_COLUMNS] for c in result.candidates]
            self._log(event.metric_calls, {"candidates": self.wandb.Table(columns=CANDIDATE_COLUMNS, data=rows)})
            self.run.summary.update(
                {
                    "agentgrad/stop_reason": event.stop_reason,
                    "agentgrad/initial_val_score": event.initial_score,
                    "agentgrad/best_val_score": event.best_score,
                    "agentgrad/metric_calls": event.metric_calls,
                    "agentgrad/rounds": event.rounds,
                }
            )
        finally:
            if self.own_run:
                self.run.finish(exit_code=1 if event.interrupted else 0)
