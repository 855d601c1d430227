"""A report to look at: one self-contained HTML page per run, and PNGs of its charts on request.

Built from :class:`AgentGradResult` alone, so ``log_dir/result.json`` is enough to
rebuild it (``agentgrad report LOG_DIR``). The page has no script and loads
nothing: the charts are inline SVG (:mod:`.charts`). The PNGs are opt-in (``agentgrad report LOG_DIR
--png``): they need matplotlib, whose import and drawing cost more CPU than the
journal of a 500-call run, so ``compile`` does not draw them.
"""

from __future__ import annotations

import difflib
import html
import json
from pathlib import Path

from ..runtime.atomic_files import atomic_write_text
from .charts import attribution_svg, attribution_table, curve_svg, write_pngs
from .results import AgentGradResult

REPORT_FILE = "report.html"


def word_diff(old: str, new: str) -> str:
    """HTML of ``new`` against ``old``, word by word: removed words struck, added words marked."""
    a, b = old.split(" "), new.split(" ")
    parts = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if op in ("delete", "replace"):
            parts.append(f"<del>{html.escape(' '.join(a[i1:i2]))}</del>")
        if op in ("insert", "replace"):
            parts.append(f"<ins>{html.escape(' '.join(b[j1:j2]))}</ins>")
        if op == "equal":
            parts.append(html.escape(" ".join(a[i1:i2])))
    return " ".join(parts)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _spent(c) -> str:
    """The metric calls a candidate's judging paid, said so that a score with 0 calls reads as no contradiction."""
    if c.metric_calls or c.cluster_score_after is None:
        return f"{c.metric_calls} metric calls paid while judged"
    return "0 metric calls paid while judged (paid ahead by speculation, or scores of identical outputs reused)"


def _candidate_html(index: int, c) -> str:
    verdict = "accepted" if c.accepted else "rejected"
    diff = (
        word_diff(c.previous_instruction, c.instruction)
        if c.instruction
        else f"<em>no new instruction ({html.escape(c.reason)})</em>"
    )
    return (
        f'<section class="candidate {verdict}"><h3>#{index} round {c.round}: {html.escape(c.predictor)} '
        f'<span class="verdict">{verdict}</span></h3>'
        f"<p>cluster of {c.cluster_size} (minimum {c.min_cluster_size}); cluster score "
        f"{_fmt(c.cluster_score_before)} &rarr; {_fmt(c.cluster_score_after)}; validation {_fmt(c.val_score)}; "
        f"{_spent(c)}; {html.escape(c.reason)}</p>"
        f"<p><b>Generalized gradient:</b> {html.escape(c.gradient)}</p>"
        f'<div class="diff">{diff}</div></section>'
    )


STYLE = """
body { font-family: system-ui, sans-serif; max-width: 980px; margin: 24px auto; color: #222; padding: 0 12px; }
table { border-collapse: collapse; margin: 8px 0 16px; } td, th { border: 1px solid #ccc; padding: 3px 8px; }
.candidate { border-left: 4px solid #bbb; padding: 2px 12px; margin: 12px 0; background: #fafafa; }
.candidate.accepted { border-color: #59a14f; } .candidate.rejected { border-color: #e15759; }
.verdict { font-size: 0.8em; text-transform: uppercase; }
.diff { font-family: ui-monospace, monospace; white-space: pre-wrap; background: #fff; padding: 8px; }
del { background: #fdd; color: #900; } ins { background: #dfd; color: #060; text-decoration: none; }
pre { white-space: pre-wrap; background: #f4f4f4; padding: 8px; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.up { background: #dfd; } .down { background: #fdd; }
dl.glossary { display: grid; grid-template-columns: max-content auto; gap: 2px 12px; font-size: 0.9em; }
dl.glossary dt { font-weight: bold; } dl.glossary dd { margin: 0; }
details { margin: 8px 0; } summary { cursor: pointer; }
"""

GLOSSARY = (
    ("metric call", "one call of your metric on one program output; the budget (max_metric_calls) counts these"),
    ("round", "one pass of the five steps on a training batch: attribute, gradients, clusters, rewrites, judging"),
    ("failure", "a training example scoring below the top score (max_score)"),
    ("blamed", "a failure is blamed on the predictor whose hinted re-run fixed it (reached fix_threshold)"),
    ("hard", "a failure no hinted re-run fixed: nobody is blamed and it teaches nothing this round"),
    ("gradient", "the prompt LM's note, from one blamed failure, on what the predictor's instruction should change"),
    ("cluster", "gradients of one predictor that ask for the same change, merged into one generalized gradient"),
    ("min cluster", "the fewest gradients a cluster needs this round to get a rewrite (cluster_schedule)"),
    ("waiting", "gradients in clusters still too small: carried to the next rounds, where the minimum drops"),
    ("cluster score", "the rewrite's mean score on its cluster's own examples, before -> after; it must rise first"),
    ("validation", "the mean score on the validation set; a rewrite is kept only if it beats the best so far"),
)


def glossary_html() -> str:
    """The report's terms, each in one line."""
    items = "".join(f"<dt>{html.escape(term)}</dt><dd>{html.escape(text)}</dd>" for term, text in GLOSSARY)
    return f'<details open><summary>What the terms mean</summary><dl class="glossary">{items}</dl></details>'


def usage_html(result: AgentGradResult) -> str:
    """LM calls and tokens per role (and per phase, when recorded), as a table."""
    keys = ("calls", "prompt_tokens", "completion_tokens")
    rows = [(f"{role} LM", result.usage.get(role) or {}) for role in ("task", "prompt")]
    phases = result.usage.get("by_phase") or {}
    rows += [(f"&nbsp;&nbsp;phase {html.escape(p)} (both LMs)", u) for p, u in phases.items()]
    body = "".join(
        f"<tr><td>{label}</td>" + "".join(f'<td class="num">{usage.get(k, 0):,}</td>' for k in keys) + "</tr>"
        for label, usage in rows
    )
    cost = result.usage.get("prompt_cost_usd")
    note = f"<p>prompt LM cost: ${cost:.4f}</p>" if cost is not None else ""
    return (
        "<table><tr><th>LM usage</th><th>calls</th><th>prompt tokens</th><th>completion tokens</th></tr>"
        f"{body}</table>{note}"
    )


def val_examples_html(result: AgentGradResult) -> str:
    """Each validation example's score with the starting program and with the best one."""
    if not result.val_examples:
        return "<p>No per-example validation scores were recorded.</p>"
    rows = "".join(
        f'<tr class="{v.change}"><td>{html.escape(v.example)}</td>'
        f'<td class="num">{_fmt(v.initial)}</td><td class="num">{_fmt(v.best)}</td></tr>'
        for v in result.val_examples
    )
    changes = [v.change for v in result.val_examples]
    return (
        f"<p>{changes.count('up')} examples improved, {changes.count('down')} got worse, "
        f"{changes.count('')} unchanged.</p>"
        "<table><tr><th>validation example</th><th>starting program</th><th>best program</th></tr>"
        f"{rows}</table>"
    )


def blame_html(result: AgentGradResult) -> str:
    """Every training failure of every round and where it was put, with the blamed predictor's output
    before and with its hint."""
    if not result.blame:
        return "<p>No failure was examined.</p>"
    rows = "".join(
        f"<tr><td>{b.round}</td><td>{html.escape(b.predictor or 'hard (nobody)')}</td>"
        f"<td>{html.escape(_clip(b.example))}</td><td>{html.escape(_clip(b.original))}</td>"
        f"<td>{html.escape(_clip(b.corrected))}</td></tr>"
        for b in result.blame
    )
    return (
        f"<details><summary>{len(result.blame)} failures and where each was put</summary>"
        "<table><tr><th>round</th><th>blamed</th><th>example</th><th>output</th><th>output with the hint</th></tr>"
        f"{rows}</table></details>"
    )


def _clip(value: object, width: int = 160) -> str:
    """Fields as ``name: value`` on one line, cut at ``width``."""
    text = "; ".join(f"{k}: {v}" for k, v in value.items()) if isinstance(value, dict) else str(value)
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "\u2026"


def render_html(result: AgentGradResult) -> str:
    """The run's report as one self-contained HTML page (no files beside it, no scripts)."""
    names, rows = attribution_table(result)
    round_rows = "".join(
        f"<tr><td>{r.round}</td><td>{r.min_cluster_size}</td><td>{r.batch_size}</td><td>{r.failures}</td>"
        + "".join(f"<td>{n}</td>" for n in row)
        + f"<td>{r.hard_cases}</td><td>{r.accepted}/{r.candidates}</td><td>{_fmt(r.best_val_score)}</td>"
        f"<td>{r.metric_calls}</td></tr>"
        for r, row in zip(result.rounds, rows)
    )
    heads = "".join(f"<th>blamed: {html.escape(n)}</th>" for n in names)
    cap = f" of {result.max_metric_calls}" if result.max_metric_calls else ""
    finals = "".join(
        f"<h3>{html.escape(n)}</h3>"
        + (
            f'<div class="diff">{word_diff(result.initial_instructions.get(n, ""), text)}</div>'
            if text != result.initial_instructions.get(n)
            else f"<pre>{html.escape(text)}</pre><p>(unchanged)</p>"
        )
        for n, text in result.final_instructions.items()
    )
    candidates = "".join(_candidate_html(i, c) for i, c in enumerate(result.candidates)) or "<p>No candidate.</p>"
    objectives = "".join(
        f"<li>objective {html.escape(name)} (validation mean): {a:.4f} &rarr; {b:.4f}</li>\n"
        for name, a, b in result.objective_changes()
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>AgentGrad run report</title><style>{STYLE}</style></head>
<body><h1>AgentGrad run</h1>
<ul><li>validation score: <b>{result.initial_val_score:.4f} &rarr; {result.best_val_score:.4f}</b></li>
{objectives}<li>metric calls: {result.metric_calls}{cap}; rounds: {len(result.rounds)};
candidates: {len(result.accepted)} accepted, {len(result.rejected)} rejected</li>
<li>stop: {html.escape(result.stop_reason)}; wall time {result.wall_time_s:.1f} s</li></ul>
{usage_html(result)}
{glossary_html()}
<h2>Validation score against metric calls</h2>{curve_svg(result)}
<h2>Validation examples: starting program against the best one</h2>{val_examples_html(result)}
<h2>Failures attributed per predictor per round</h2>{attribution_svg(result)}
<table><tr><th>round</th><th>min cluster</th><th>batch</th><th>failures</th>{heads}<th>hard</th>
<th>accepted</th><th>best val</th><th>metric calls</th></tr>{round_rows}</table>
{blame_html(result)}
<h2>Candidates</h2>{candidates}
<h2>Final instructions (against the initial ones)</h2>{finals}
</body></html>
"""


def write_report(log_dir: str | Path, result: AgentGradResult | None = None, pngs: bool = False) -> Path:
    """Write ``report.html`` into ``log_dir``, and with ``pngs`` the two charts as PNGs (needs matplotlib).

    Without ``result``, reads ``log_dir/result.json``; returns the page's path.
    """
    log_dir = Path(log_dir)
    if result is None:
        source = log_dir / "result.json"
        if not source.exists():
            raise FileNotFoundError(f"{source} not found: pass the log_dir of a finished AgentGrad run")
        try:
            result = AgentGradResult.from_dict(json.loads(source.read_text(encoding="utf-8")))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ValueError(
                f"{source} is damaged or not an AgentGrad result ({type(exc).__name__}: {exc}); it is written "
                "again when the run finishes: compile again with the same log_dir (the journal replays what was "
                "paid for), then run agentgrad report again"
            ) from None
    page = log_dir / REPORT_FILE
    atomic_write_text(page, render_html(result))
    if pngs:
        write_pngs(result, log_dir)
    return page
