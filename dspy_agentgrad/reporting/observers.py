"""The run's own subscribers to engine events: the progress bar and the ``state.json`` snapshot."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from tqdm.auto import tqdm

from ..core.events import (
    AgentGradCallback,
    AttributionDone,
    CandidateJudged,
    CandidateProposed,
    RoundEnd,
    RoundStart,
    RunEnd,
    ValidationScored,
)
from ..runtime.budget import Budget
from ..runtime.store import atomic_write_json
from .results import AgentGradResult


class ProgressBar(AgentGradCallback):
    """A tqdm bar over metric calls, labelled with the round and the step."""

    def __init__(self, budget: Budget, enabled: bool):
        self.budget = budget
        self.bar = tqdm(total=budget.max_metric_calls, desc="AgentGrad", unit="metric call", disable=not enabled)
        self.round = 0

    def _show(self, step: str, best: float | None = None) -> None:
        self.bar.n = self.budget.metric_calls
        self.bar.set_description(f"AgentGrad round {self.round} {step}")
        if best is not None:
            self.bar.set_postfix(best_val=f"{best:.3f}")
        self.bar.refresh()

    def on_validation_scored(self, event: ValidationScored) -> None:
        self._show("validate", event.best_score)

    def on_round_start(self, event: RoundStart) -> None:
        self.round = event.round
        self._show("attribute")

    def on_attribution(self, event: AttributionDone) -> None:
        self._show("gradients")

    def on_candidate_proposed(self, event: CandidateProposed) -> None:
        self._show(f"candidate for {event.predictor}")

    def on_candidate_accepted(self, event: CandidateJudged) -> None:
        self._show("update", event.best_score)

    def on_candidate_rejected(self, event: CandidateJudged) -> None:
        self._show("update", event.best_score)

    def on_run_end(self, event: RunEnd) -> None:
        self.bar.n = self.budget.metric_calls
        self.bar.close()


class StateSnapshot(AgentGradCallback):
    """Writes ``log_dir/state.json`` after the first validation and at every round end.

    The snapshot says where the run stands (round, budget spent, best score, the best
    instructions, the last round, what was paid); its size does not grow with the
    number of rounds. The full history is in ``result.json`` at the end, and the
    journal holds everything a resume needs.
    """

    def __init__(self, path: Path, snapshot: Callable[[], AgentGradResult]):
        self.path = path
        self.snapshot = snapshot

    def _write(self, step: str) -> None:
        result = self.snapshot()
        atomic_write_json(
            self.path,
            {
                "step": step,
                "round": len(result.rounds),
                "metric_calls": result.metric_calls,
                "max_metric_calls": result.max_metric_calls,
                "initial_val_score": result.initial_val_score,
                "best_val_score": result.best_val_score,
                "best_instructions": result.final_instructions,
                "candidates": len(result.candidates),
                "accepted": len(result.accepted),
                "last_round": asdict(result.rounds[-1]) if result.rounds else None,
                "usage": {role: result.usage.get(role) for role in ("task", "prompt")},
                "paid": result.paid,
                "wall_time_s": result.wall_time_s,
            },
        )

    def on_validation_scored(self, event: ValidationScored) -> None:
        if event.candidate is None:
            self._write("validated the starting program")

    def on_round_end(self, event: RoundEnd) -> None:
        self._write(f"round {event.record.round} done")
