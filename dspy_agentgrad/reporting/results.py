"""What a run produced, in forms people can read: dataclasses, JSON and a Markdown summary."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from ..core.state import AttributionRecord, AttributionReport, BlameRecord, CandidateRecord, RoundRecord, RunState
from ..program.program_state import ProgramState
from ..runtime.jsonable import to_jsonable

if TYPE_CHECKING:
    from ..runtime.budget import Budget

__all__ = [  # the records live with the run's state; they are imported from here too
    "AgentGradResult",
    "AttributionRecord",
    "AttributionReport",
    "BlameRecord",
    "CandidateRecord",
    "RoundRecord",
    "ValExample",
    "paid_totals",
    "why_unchanged",
]

RESULT_FORMAT = 1

_MARKDOWN_PUNCTUATION = re.compile(r"([\\`*_{}\[\]()#+\-.!|~])")
_HTML = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}
_URL = re.compile(r"(?i)\b(?:[a-z][a-z0-9+.\-]*://|www\.)\S+")


def _escaped(text: str) -> str:
    text = _MARKDOWN_PUNCTUATION.sub(r"\\\1", text)
    return "".join(_HTML.get(ch, ch) for ch in text)


def inert(value: Any) -> str:
    """Run content (instructions, reasons, error text, names) as Markdown that renders as the text itself, on
    one line: every Markdown sign escaped, HTML written as entities, and each URL in a code span (where no
    renderer links it), so no image, link or tag in it can come alive."""
    text = " ".join(str(value).split())
    parts, start = [], 0
    for url in _URL.finditer(text):
        parts += [_escaped(text[start : url.start()]), code_span(url.group(0))]
        start = url.end()
    return "".join(parts) + _escaped(text[start:])


def _ticks(text: str) -> int:
    return max((len(run) for run in re.findall(r"`+", text)), default=0)


def code_block(text: str) -> str:
    """``text`` in a fenced block longer than any backtick run in it: it cannot close the block early."""
    fence = "`" * max(3, _ticks(text) + 1)
    return f"{fence}text\n{text}\n{fence}"


def code_span(text: str) -> str:
    """``text`` in an inline code span whose backticks outnumber any run in it, on one line."""
    text = " ".join(text.split())
    ticks = "`" * (_ticks(text) + 1)
    return f"{ticks} {text} {ticks}"


@dataclass
class ValExample:
    """One validation example's score with the starting program and with the best program found."""

    example: str  # its label: the inputs, clipped
    initial: float | None
    best: float | None

    @property
    def change(self) -> str:
        """How the best program did on it: "up", "down", or "" (unchanged or unknown)."""
        if self.initial is None or self.best is None or self.best == self.initial:
            return ""
        return "up" if self.best > self.initial else "down"


def why_unchanged(rounds: list[dict], candidates: list[dict], stop_reason: str) -> str:
    """One sentence on why no rewrite was kept, from a run's round and candidate records (as dicts)."""
    if not rounds:
        return f"no round ran ({stop_reason})."
    failures = sum(r["failures"] for r in rounds)
    if failures == 0:
        return "no training example failed, so there was nothing to learn from."
    attributed = sum(sum(r["attributed"].values()) for r in rounds)
    reflected = sum(r.get("reflected", 0) for r in rounds)
    deferred = sum(r.get("cumulative_deferred", 0) for r in rounds)
    waited = (
        f" ({deferred} waited for cumulative hints until their example came back in a later batch, as "
        'cumulative_hints="revisits" does; cumulative_hints=True tries them in their first batch)'
        if deferred
        else ""
    )
    hard = (
        f"none of the {failures} failures could be attributed: no hinted re-run (single or cumulative) "
        f"reached the fix threshold{waited}, so every failure was a hard case. Check that the hints tell a "
        "predictor what a correct run needs, that the task LM follows them (a small model that ignores "
        'advice may copy a worked example: a hint_fn returning the output itself, with hint_delivery="demo"), '
        "or lower fix_threshold for a graded metric."
    )
    if attributed == 0 and reflected == 0:
        return hard
    if sum(r["gradients"] for r in rounds) == 0:
        return "failures were attributed, but the prompt LM wrote no usable gradient (see prompt_role_failures)."
    prefix = f"{hard} Reflections on them gave {reflected} gradient(s): " if attributed == 0 else ""
    if not candidates:
        if sum(r["clusters"] for r in rounds):  # clusters were ready: the run stopped before judging one
            return (
                f"{prefix}gradients were clustered, but the run stopped before a candidate was judged ({stop_reason})."
            )
        return (
            f"{prefix}gradients were written, but no cluster reached the minimum cluster size before the run stopped"
            f" ({stop_reason})."
        )
    reasons = Counter(c["reason"] for c in candidates)
    listed = ", ".join(f"{n} {reason}" for reason, n in reasons.items())
    return (
        f"{prefix}{len(candidates)} candidate(s) were judged and none won both stages ({listed}); "
        f"the run then stopped: {stop_reason}."
    )


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
    val_examples: list[ValExample] = field(default_factory=list)  # per validation example: starting vs best
    val_objectives: dict[str, dict[str, float]] = field(default_factory=dict)  # "initial"/"best": mean per objective
    blame: list[BlameRecord] = field(default_factory=list)  # every training failure and where it went
    metric_calls: int = 0
    max_metric_calls: int | None = None
    reused_runs: int = 0  # program runs whose output equalled an earlier run's: its score taken, no metric call
    # the runs' task-LM spend in metric calls: each run counts the share of its calls it made anew (one with nothing
    # to reuse); with cap_task_spend, max_metric_calls bounds it as it bounds metric_calls
    task_spend: float = 0.0
    usage: dict = field(default_factory=dict)
    phase_calls: dict = field(default_factory=dict)  # metric calls per phase of program runs
    phase_wall_s: dict = field(default_factory=dict)  # seconds waited on runs per phase (overlapping phases both count)
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
        state: RunState,
        *,
        budget: Budget,
        usage: dict,
        reused_runs: int,
        program_errors: dict[str, int],
        prompt_role_failures: dict[str, int],
        seed: int,
        phase_calls: dict[str, int] | None = None,
        phase_wall_s: dict[str, float] | None = None,
        initial_instructions: dict[str, str],
        wall_time_s: float,
        resumed: bool,
        segments: list[dict] | None = None,
        options: dict,
        log_dir: str | None,
    ) -> AgentGradResult:
        """The result of a run so far, from its state and what it spent (also used for snapshots while it runs)."""
        usage = dict(usage)
        if budget.max_prompt_cost:
            usage["prompt_cost_usd"] = budget.prompt_cost

        def score(value: float | None) -> float:
            return float("nan") if value is None else value

        return cls(
            best_val_score=score(state.best_val_score),
            initial_val_score=score(state.initial_val_score),
            final_instructions=state.instructions.instructions,
            final_demos=state.instructions.demos,
            initial_instructions=dict(initial_instructions),
            candidates=list(state.candidates),
            rounds=list(state.rounds),
            val_history=list(state.val_history),
            val_examples=[
                ValExample(label, initial, best)
                for label, initial, best in zip(state.val_labels, state.initial_val_scores, state.best_val_scores)
            ],
            val_objectives=(
                {"initial": dict(state.initial_val_objectives), "best": dict(state.best_val_objectives)}
                if state.best_val_objectives
                else {}
            ),
            blame=list(state.blame),
            metric_calls=budget.metric_calls,
            max_metric_calls=budget.max_metric_calls,
            reused_runs=reused_runs,
            task_spend=float(budget.task_spend),
            usage=usage,
            phase_calls=dict(sorted((phase_calls or {}).items())),
            phase_wall_s={k: round(v, 3) for k, v in sorted((phase_wall_s or {}).items())},
            program_errors=dict(program_errors),
            prompt_role_failures=dict(prompt_role_failures),
            wall_time_s=wall_time_s,
            segments=list(segments or []),
            paid=paid_totals(segments or []),
            stop_reason=state.stop_reason,
            interrupted=state.interrupted,
            resumed=resumed,
            seed=seed,
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
        values["val_examples"] = [ValExample(**v) for v in data.get("val_examples", [])]
        values["blame"] = [BlameRecord(**b) for b in data.get("blame", [])]
        return cls(**values)

    def final_state(self) -> ProgramState:
        """The best program found: its instructions and the demonstrations it adds."""
        return ProgramState(self.final_instructions, self.final_demos)

    @property
    def accepted(self) -> list[CandidateRecord]:
        """The candidates that were kept, in the order they were judged."""
        return [c for c in self.candidates if c.accepted]

    @property
    def rejected(self) -> list[CandidateRecord]:
        """The candidates that were not kept (each record says why)."""
        return [c for c in self.candidates if not c.accepted]

    @property
    def hard_cases(self) -> int:
        """Failures no hint could fix, over all rounds."""
        return sum(r.hard_cases for r in self.rounds)

    def to_dict(self) -> dict:
        """The JSON form written to ``result.json`` (read back by :meth:`from_dict`)."""
        data = {"format": RESULT_FORMAT, **asdict(self)}
        data["val_history"] = [list(p) for p in self.val_history]
        data["hard_cases_total"] = self.hard_cases
        return to_jsonable(data)

    def why_unchanged(self) -> str | None:
        """Why the program came back unchanged, or None when a rewrite was kept."""
        if self.accepted:
            return None
        return why_unchanged([asdict(r) for r in self.rounds], [asdict(c) for c in self.candidates], self.stop_reason)

    def objective_changes(self) -> list[tuple[str, float, float]]:
        """(objective, starting program's validation mean, best program's) for each objective the metric reports."""
        initial, best = self.val_objectives.get("initial", {}), self.val_objectives.get("best", {})
        return [(name, initial.get(name, 0.0), value) for name, value in best.items()]

    def to_markdown(self) -> str:
        """The run as Markdown (``result.md``): scores, rounds, candidates, final instructions."""
        unchanged = self.why_unchanged()
        lines = [
            "# AgentGrad run",
            "",
            f"- validation score: {self.initial_val_score:.4f} -> {self.best_val_score:.4f}",
            f"- metric calls: {self.metric_calls}"
            + (f" of {self.max_metric_calls}" if self.max_metric_calls else "")
            + (f"; {self.reused_runs} more runs reused an earlier run's score" if self.reused_runs else "")
            + f"; task spend {self.task_spend:.1f} (calls made anew, in metric calls)",
            f"- rounds: {len(self.rounds)}; stop: {inert(self.stop_reason)}; wall time: {self.wall_time_s:.1f} s"
            + (f" over {len(self.segments)} segments (resumed)" if len(self.segments) > 1 else ""),
            *(f"- objective {n} (validation mean): {a:.4f} -> {b:.4f}" for n, a, b in self.objective_changes()),
            *([f"- unchanged: {inert(unchanged)}"] if unchanged else []),
            f"- paid over all segments: {self.paid.get('metric_calls', self.metric_calls)} metric calls; "
            f"task LM {inert(self.paid.get('task', {}))}; prompt LM {inert(self.paid.get('prompt', {}))}",
            f"- task LM: {inert(self.usage.get('task', {}))}; prompt LM: {inert(self.usage.get('prompt', {}))}",
            f"- program errors: {inert(self.program_errors or 'none')}; "
            f"prompt-LM role failures: {inert(self.prompt_role_failures or 'none')}",
            "",
            "## Rounds",
            "",
            "| round | min cluster | batch | failures | attributed | hard | clusters | accepted | best val |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r in self.rounds:
            attributed = inert(", ".join(f"{k}: {v}" for k, v in r.attributed.items() if v) or "-")
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

            decision = ("accepted" if c.accepted else f"rejected ({inert(c.reason)})") + (
                f"; {len(c.demos or [])} demos" if c.kind == "demos" else ""
            )
            lines.append(
                f"| {c.round} | {inert(c.predictor)} | {c.cluster_size} | {fmt(c.cluster_score_before)} -> "
                f"{fmt(c.cluster_score_after)} | {fmt(c.val_score)} | {decision} |"
            )
        lines += ["", "## Final instructions", ""]
        for name, text in self.final_instructions.items():
            lines += [f"### {inert(name)}", "", code_block(text), ""]
            for demo in self.final_demos.get(name, []):
                lines.append(f"- demonstration: {code_span(str(to_jsonable(demo)))}")
        return "\n".join(lines)
