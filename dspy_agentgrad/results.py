"""What a run produced, in forms people can read: dataclasses, JSON and a Markdown summary."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import dspy

from .jsonable import to_jsonable
from .program_state import ProgramState

if TYPE_CHECKING:
    from .engine import RoundEngine

RESULT_FORMAT = 1


@dataclass
class AttributionRecord:
    """A failure fixed by hinting one predictor: the agent-level pseudo-label."""

    example: dspy.Example
    inputs: dict[str, Any]
    original: dict[str, Any]
    corrected: dict[str, Any]
    feedback: str = ""
    program_outputs: dict[str, Any] = field(default_factory=dict)
    leaked: bool = False  # the fix copied a value its hint revealed and the inputs lack: never a demonstration

    def to_dict(self) -> dict:
        return {
            "example": to_jsonable(self.example.toDict()),
            "inputs": self.inputs,
            "original": self.original,
            "corrected": self.corrected,
            "feedback": self.feedback,
            "leaked": self.leaked,
        }


@dataclass
class AttributionReport:
    """Steps 1-2 of AgentGrad: which predictor is at fault for each failure."""

    order: list[str]
    attributed: dict[str, list[AttributionRecord]]
    hard_cases: list[dspy.Example]
    passed: list[dspy.Example]
    leaked: int = 0
    explained_single: int = 0
    explained_cumulative: int = 0
    replay_misses: int = 0

    def counts(self) -> dict[str, int]:
        return {name: len(records) for name, records in self.attributed.items()}

    def to_dict(self) -> dict:
        return {
            "order": self.order,
            "attributed": {k: [r.to_dict() for r in v] for k, v in self.attributed.items()},
            "hard_cases": [to_jsonable(e.toDict()) for e in self.hard_cases],
            "passed": len(self.passed),
            "rejected_as_label_leak": self.leaked,
            "explained_single": self.explained_single,
            "explained_cumulative": self.explained_cumulative,
            "replay_misses": self.replay_misses,
        }


@dataclass
class CandidateRecord:
    round: int
    predictor: str
    cluster_size: int
    min_cluster_size: int
    gradient: str
    previous_instruction: str
    instruction: str | None
    cluster_score_before: float | None = None
    cluster_score_after: float | None = None
    val_score: float | None = None
    accepted: bool = False
    reason: str = ""
    metric_calls: int = 0
    kind: str = "instructions"  # "instructions": a rewrite; "demos": demonstrations from pseudo-labels
    demos: list[dict] | None = None  # the predictor's added demonstrations under this candidate


@dataclass
class RoundRecord:
    round: int
    min_cluster_size: int
    batch_size: int
    failures: int
    attributed: dict[str, int]
    hard_cases: int
    label_leaks: int
    gradients: int
    clusters: int
    waiting: int
    candidates: int = 0
    accepted: int = 0
    best_val_score: float | None = None
    metric_calls: int = 0
    explained_single: int = 0
    explained_cumulative: int = 0


def why_unchanged(rounds: list[dict], candidates: list[dict], stop_reason: str) -> str:
    """One sentence on why no rewrite was kept, from a run's round and candidate records (as dicts)."""
    if not rounds:
        return f"no round ran ({stop_reason})."
    failures = sum(r["failures"] for r in rounds)
    if failures == 0:
        return "no training example failed, so there was nothing to learn from."
    if sum(sum(r["attributed"].values()) for r in rounds) == 0:
        return (
            f"none of the {failures} failures could be attributed: no hinted re-run (single or cumulative) "
            "reached the fix threshold, so every failure was a hard case. Check that the hints tell a "
            "predictor what a correct run needs, that the task LM follows them, or lower fix_threshold "
            "for a graded metric."
        )
    if sum(r["gradients"] for r in rounds) == 0:
        return "failures were attributed, but the prompt LM wrote no usable gradient (see prompt_role_failures)."
    if not candidates:
        return "gradients were written, but no cluster reached the minimum cluster size before the run stopped."
    reasons = Counter(c["reason"] for c in candidates)
    listed = ", ".join(f"{n} {reason}" for reason, n in reasons.items())
    return f"{len(candidates)} candidate(s) were judged and none won both stages ({listed})."


def paid_totals(segments: list[dict]) -> dict:
    """Wall time, metric calls and LM usage summed over segments."""
    totals: dict[str, Any] = {
        "segments": len(segments),
        "wall_time_s": 0.0,
        "metric_calls": 0,
        "task": {},
        "prompt": {},
    }
    for seg in segments:
        totals["wall_time_s"] += seg.get("wall_time_s", 0.0)
        totals["metric_calls"] += seg.get("metric_calls", 0)
        for role in ("task", "prompt"):
            for key, value in seg.get(role, {}).items():
                totals[role][key] = totals[role].get(key, 0) + value
    return totals


@dataclass
class AgentGradResult:
    """Everything a run decided and spent; ``to_dict``/``from_dict`` round-trip it through JSON.

    ``metric_calls`` and ``usage`` are the algorithm's own count: the same for a run
    that was killed and resumed as for one that was not. What was really paid over
    every compile on the ``log_dir`` (killed segments and work paid twice included)
    is in ``paid`` (totals) and ``segments`` (one entry per compile: wall time,
    metric calls and LM usage paid in it); ``wall_time_s`` is the total of all segments.
    """

    best_val_score: float
    initial_val_score: float
    final_instructions: dict[str, str]
    initial_instructions: dict[str, str]
    final_demos: dict[str, list[dict]] = field(default_factory=dict)  # demonstrations added per predictor
    candidates: list[CandidateRecord] = field(default_factory=list)
    rounds: list[RoundRecord] = field(default_factory=list)
    val_history: list[tuple[int, float]] = field(default_factory=list)
    metric_calls: int = 0
    max_metric_calls: int | None = None
    reused_runs: int = 0  # program runs whose output equalled an earlier run's: its score taken, no metric call
    usage: dict = field(default_factory=dict)
    program_errors: dict[str, int] = field(default_factory=dict)
    prompt_role_failures: dict[str, int] = field(default_factory=dict)
    wall_time_s: float = 0.0
    segments: list[dict] = field(default_factory=list)
    paid: dict = field(default_factory=dict)
    stop_reason: str = ""
    interrupted: bool = False
    resumed: bool = False
    seed: int = 0
    options: dict = field(default_factory=dict)
    log_dir: str | None = None

    @classmethod
    def from_run(
        cls,
        engine: RoundEngine,
        *,
        initial_instructions: dict[str, str],
        wall_time_s: float,
        resumed: bool,
        segments: list[dict] | None = None,
        options: dict,
        log_dir: str | None,
    ) -> AgentGradResult:
        """The result of ``engine``'s run so far (also used for snapshots while it runs)."""
        budget = engine.evaluator.budget
        usage = engine.evaluator.ledger.to_dict()
        if budget.max_prompt_cost:
            usage["prompt_cost_usd"] = budget.prompt_cost

        def score(value: float | None) -> float:
            return float("nan") if value is None else value

        return cls(
            best_val_score=score(engine.best_val_score),
            initial_val_score=score(engine.initial_val_score),
            final_instructions=engine.instructions.instructions,
            final_demos=engine.instructions.demos,
            initial_instructions=dict(initial_instructions),
            candidates=list(engine.candidates),
            rounds=list(engine.rounds),
            val_history=list(engine.val_history),
            metric_calls=budget.metric_calls,
            max_metric_calls=budget.max_metric_calls,
            reused_runs=engine.evaluator.reused,
            usage=usage,
            program_errors=dict(engine.evaluator.errors),
            prompt_role_failures=dict(engine.proposer.failures),
            wall_time_s=wall_time_s,
            segments=list(segments or []),
            paid=paid_totals(segments or []),
            stop_reason=engine.stop_reason,
            interrupted=engine.interrupted,
            resumed=resumed,
            seed=engine.config.seed,
            options=options,
            log_dir=log_dir,
        )

    @classmethod
    def from_dict(cls, data: dict) -> AgentGradResult:
        """Read back what :meth:`to_dict` wrote (``result.json``)."""
        if data.get("format", RESULT_FORMAT) > RESULT_FORMAT:
            raise ValueError(
                f"result format {data['format']} is newer than this dspy-agentgrad reads "
                f"({RESULT_FORMAT}); upgrade dspy-agentgrad"
            )
        known = set(cls.__dataclass_fields__)
        values = {k: v for k, v in data.items() if k in known}
        values["candidates"] = [CandidateRecord(**c) for c in data.get("candidates", [])]
        values["rounds"] = [RoundRecord(**r) for r in data.get("rounds", [])]
        values["val_history"] = [(int(calls), float(score)) for calls, score in data.get("val_history", [])]
        return cls(**values)

    def final_state(self) -> ProgramState:
        """The best program found: its instructions and the demonstrations it adds."""
        return ProgramState(self.final_instructions, self.final_demos)

    @property
    def accepted(self) -> list[CandidateRecord]:
        return [c for c in self.candidates if c.accepted]

    @property
    def rejected(self) -> list[CandidateRecord]:
        return [c for c in self.candidates if not c.accepted]

    @property
    def hard_cases(self) -> int:
        return sum(r.hard_cases for r in self.rounds)

    def to_dict(self) -> dict:
        data = {"format": RESULT_FORMAT, **asdict(self)}
        data["val_history"] = [list(p) for p in self.val_history]
        data["hard_cases_total"] = self.hard_cases
        return to_jsonable(data)

    def why_unchanged(self) -> str | None:
        """Why the program came back unchanged, or None when a rewrite was kept."""
        if self.accepted:
            return None
        return why_unchanged([asdict(r) for r in self.rounds], [asdict(c) for c in self.candidates], self.stop_reason)

    def to_markdown(self) -> str:
        unchanged = self.why_unchanged()
        lines = [
            "# AgentGrad run",
            "",
            f"- validation score: {self.initial_val_score:.4f} -> {self.best_val_score:.4f}",
            f"- metric calls: {self.metric_calls}"
            + (f" of {self.max_metric_calls}" if self.max_metric_calls else "")
            + (f"; {self.reused_runs} more runs reused an earlier run's score" if self.reused_runs else ""),
            f"- rounds: {len(self.rounds)}; stop: {self.stop_reason}; wall time: {self.wall_time_s:.1f} s"
            + (f" over {len(self.segments)} segments (resumed)" if len(self.segments) > 1 else ""),
            *([f"- unchanged: {unchanged}"] if unchanged else []),
            f"- paid over all segments: {self.paid.get('metric_calls', self.metric_calls)} metric calls; "
            f"task LM {self.paid.get('task', {})}; prompt LM {self.paid.get('prompt', {})}",
            f"- task LM: {self.usage.get('task', {})}; prompt LM: {self.usage.get('prompt', {})}",
            f"- program errors: {self.program_errors or 'none'}; "
            f"prompt-LM role failures: {self.prompt_role_failures or 'none'}",
            "",
            "## Rounds",
            "",
            "| round | min cluster | batch | failures | attributed | hard | clusters | accepted | best val |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r in self.rounds:
            attributed = ", ".join(f"{k}: {v}" for k, v in r.attributed.items() if v) or "-"
            best = "-" if r.best_val_score is None else f"{r.best_val_score:.4f}"
            lines.append(
                f"| {r.round} | {r.min_cluster_size} | {r.batch_size} | {r.failures} | {attributed} | "
                f"{r.hard_cases} | {r.clusters} | {r.accepted}/{r.candidates} | {best} |"
            )
        lines += [
            "",
            "## Candidates",
            "",
            "| round | predictor | cluster | cluster before -> after | val | decision |",
            "|---|---|---|---|---|---|",
        ]
        for c in self.candidates:

            def fmt(x):
                return "-" if x is None else f"{x:.3f}"

            decision = ("accepted" if c.accepted else f"rejected ({c.reason})") + (
                f"; {len(c.demos or [])} demos" if c.kind == "demos" else ""
            )
            lines.append(
                f"| {c.round} | {c.predictor} | {c.cluster_size} | {fmt(c.cluster_score_before)} -> "
                f"{fmt(c.cluster_score_after)} | {fmt(c.val_score)} | {decision} |"
            )
        lines += ["", "## Final instructions", ""]
        for name, text in self.final_instructions.items():
            lines += [f"### {name}", "", "```", text, "```", ""]
            for demo in self.final_demos.get(name, []):
                lines.append(f"- demonstration: `{to_jsonable(demo)}`")
        return "\n".join(lines)
