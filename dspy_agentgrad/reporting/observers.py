"""The run's own subscribers to engine events: the log lines, the progress bar and the ``state.json`` snapshot."""

from __future__ import annotations

import logging
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
    RunStart,
    ValidationScored,
)
from ..runtime.atomic_files import atomic_write_json
from ..runtime.budget import Budget
from .results import AgentGradResult


class VerdictCounts(AgentGradCallback):
    """Counts accepted and rejected candidates for a tracker, which logs them in :meth:`on_verdict`."""

    def __init__(self) -> None:
        self.accepted = self.rejected = 0

    def verdict_counts(self) -> dict[str, int]:
        """The counts as the trackers log them."""
        return {"candidates_accepted": self.accepted, "candidates_rejected": self.rejected}

    def on_verdict(self, event: CandidateJudged) -> None:
        """Called after each verdict, with the counts up to date."""

    def on_candidate_accepted(self, event: CandidateJudged) -> None:
        self.accepted += 1
        self.on_verdict(event)

    def on_candidate_rejected(self, event: CandidateJudged) -> None:
        self.rejected += 1
        self.on_verdict(event)


#: Under DSPy's ``dspy`` logger, so a compile prints what DSPy's own optimizers print, where they print it.
logger = logging.getLogger("dspy.agentgrad")


def _blame(counts: dict[str, int]) -> str:
    return ", ".join(f"{name} {n}" for name, n in counts.items()) or "none"


class RunLog(AgentGradCallback):
    """The run told on DSPy's logger: the start, a line per round and per candidate verdict, the stop.

    ``verbose`` adds each candidate's generalized gradient and proposed instruction, as
    ``dspy.MIPROv2(verbose=True)`` shows its candidate programs.
    """

    def __init__(self, verbose: bool = False, projected: Callable[[], int | None] = lambda: None):
        self.verbose = verbose
        self.projected = projected  # the run's projected metric calls, told at each round end
        self.batch_size = 0

    def on_run_start(self, event: RunStart) -> None:
        limits = [f"{event.max_metric_calls} metric calls" if event.max_metric_calls else ""]
        limits.append(f"{event.max_rounds} rounds" if event.max_rounds else "")
        logger.info(
            "AgentGrad: %s %d predictor(s) (%s) on %d training and %d validation examples; at most %s",
            "resuming" if event.resumed else "optimizing",
            len(event.predictors),
            ", ".join(event.predictors),
            event.n_train,
            event.n_val,
            " or ".join(limit for limit in limits if limit),
        )

    def on_validation_scored(self, event: ValidationScored) -> None:
        if event.candidate is None:
            logger.info("starting program: validation score %.4f", event.score)

    def on_round_start(self, event: RoundStart) -> None:
        self.batch_size = event.batch_size

    def on_attribution(self, event: AttributionDone) -> None:
        report = event.report
        if event.failures == 0:
            logger.info("round %d: 0/%d failed", event.round, self.batch_size)
            return
        logger.info(
            "round %d: %d/%d failed; blamed: %s; %d hard case(s)%s%s",
            event.round,
            event.failures,
            self.batch_size,
            _blame(report.counts()),
            len(report.hard_cases),
            f" ({report.cumulative_deferred} get cumulative hints when their example comes back)"
            if report.cumulative_deferred
            else "",
            f"; {report.leaked} label leak(s) refused" if report.leaked else "",
        )

    def on_candidate_proposed(self, event: CandidateProposed) -> None:
        if self.verbose:
            logger.info(
                "round %d: rewrite of %s for a cluster of %d\n  gradient: %s\n  instruction: %s",
                event.round,
                event.predictor,
                event.cluster_size,
                event.gradient,
                event.instruction,
            )

    def _verdict(self, event: CandidateJudged) -> None:
        c = event.candidate
        scores = "" if c.cluster_score_before is None else f"; cluster {c.cluster_score_before:.2f} -> "
        if c.cluster_score_before is not None:
            scores += "-" if c.cluster_score_after is None else f"{c.cluster_score_after:.2f}"
        if c.val_score is not None:
            scores += f", validation {c.val_score:.4f}"
        logger.info(
            "round %d: %s %s of %s (cluster of %d): %s%s; best %.4f",
            c.round,
            "ACCEPTED" if c.accepted else "rejected",
            "demonstrations" if c.kind == "demos" else "rewrite",
            c.predictor,
            c.cluster_size,
            c.reason,
            scores,
            event.best_score,
        )

    on_candidate_accepted = _verdict
    on_candidate_rejected = _verdict

    def on_round_end(self, event: RoundEnd) -> None:
        r = event.record
        logger.info(
            "round %d done: %d gradient(s) -> %d cluster(s) (min size %d), %d waiting; %d/%d candidate(s) kept%s; "
            "best validation %s; %d metric calls%s",
            r.round,
            r.gradients,
            r.clusters,
            r.min_cluster_size,
            r.waiting,
            r.accepted,
            r.candidates,
            f", {len(r.stacked)} winner(s) waiting for the next round's validation pass" if r.stacked else "",
            "-" if r.best_val_score is None else f"{r.best_val_score:.4f}",
            r.metric_calls,
            "" if self.projected() is None else f" of ~{self.projected()} projected",
        )

    def on_run_end(self, event: RunEnd) -> None:
        logger.info(
            "AgentGrad stopped: %s; validation %s -> %s after %d metric calls in %d round(s)",
            event.stop_reason,
            "-" if event.initial_score is None else f"{event.initial_score:.4f}",
            "-" if event.best_score is None else f"{event.best_score:.4f}",
            event.metric_calls,
            event.rounds,
        )


class ProgressBar(AgentGradCallback):
    """A tqdm bar over metric calls, labelled with the round and the step.

    Its total is the run's projected metric calls (``projected()``, None until there is a
    projection), followed as the projection changes; at the end it closes at 100% with the stop reason.
    While it is open, the bar is cleared before each line of AgentGrad's log, so the two do not
    share a line.
    """

    def __init__(self, budget: Budget, enabled: bool, projected: Callable[[], int | None]):
        self.budget = budget
        self.projected = projected
        self.bar = tqdm(total=None, desc="AgentGrad", unit="metric call", disable=not enabled)
        self.round = 0
        logger.addFilter(self._clear)

    def _clear(self, record: logging.LogRecord) -> bool:
        self.bar.clear()  # redrawn at the next step
        return True

    def close(self) -> None:
        logger.removeFilter(self._clear)
        self.bar.close()

    def _show(self, step: str, best: float | None = None) -> None:
        self.bar.n = self.budget.metric_calls
        total = self.projected()
        if total is not None:
            self.bar.total = max(total, self.bar.n)
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
        self.bar.n = self.bar.total = self.budget.metric_calls
        self.bar.set_description(f"AgentGrad stopped: {event.stop_reason}")
        self.close()


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
