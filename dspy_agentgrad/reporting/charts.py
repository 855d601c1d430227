"""The report's two charts, the validation curve and the failures blamed per predictor per round: inline SVG for
the page, and PNGs (matplotlib, imported only when they are asked for)."""

from __future__ import annotations

import html
import io
from pathlib import Path
from typing import Any

from ..runtime.atomic_files import atomic_write_bytes
from .results import AgentGradResult

CURVE_PNG = "validation_curve.png"
ATTRIBUTION_PNG = "attributions.png"
COLORS = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#9c755f")
WIDTH, HEIGHT, PAD = 640, 260, 48


def attribution_table(result: AgentGradResult) -> tuple[list[str], list[list[int]]]:
    """Predictor names (in first-seen order) and, per round, how many failures each was blamed for."""
    names: list[str] = []
    for record in result.rounds:
        names += [n for n in record.attributed if n not in names]
    return names, [[record.attributed.get(n, 0) for n in names] for record in result.rounds]


def candidate_positions(result: AgentGradResult) -> list[tuple[int, float, bool]]:
    """(metric calls when validated, validation score, accepted) of each validation pass of a candidate;
    winners validated together (``validate_together``) share one point.

    A result written before candidates recorded ``validated_at``: candidates are a round's last steps,
    so each one ends at its round's total minus what the round's later candidates spent.
    """
    passes = {(c.validated_at, c.val_score, c.accepted) for c in result.candidates if c.validated_at is not None}
    if passes:
        return sorted(passes)
    out = []
    for record in result.rounds:
        members = [c for c in result.candidates if c.round == record.round]
        end = record.metric_calls
        for c in reversed(members):
            if c.val_score is not None:
                out.append((end, c.val_score, c.accepted))
            end -= c.metric_calls
    return sorted(out)


def _scale(lo: float, hi: float, out_lo: float, out_hi: float):
    span = (hi - lo) or 1.0
    return lambda v: out_lo + (v - lo) / span * (out_hi - out_lo)


def _axes(x_label: str, y_label: str, y_lo: float, y_hi: float, tick_format: str = ".2f") -> list[str]:
    bottom, right = HEIGHT - PAD, WIDTH - 16
    y = _scale(y_lo, y_hi, bottom, 16)
    out = [
        f'<line x1="{PAD}" y1="{bottom}" x2="{right}" y2="{bottom}" stroke="#333"/>',
        f'<line x1="{PAD}" y1="16" x2="{PAD}" y2="{bottom}" stroke="#333"/>',
        f'<text x="{(PAD + right) / 2}" y="{HEIGHT - 8}" text-anchor="middle">{html.escape(x_label)}</text>',
        f'<text x="12" y="{HEIGHT / 2}" text-anchor="middle" transform="rotate(-90 12 {HEIGHT / 2})">'
        f"{html.escape(y_label)}</text>",
    ]
    for tick in (y_lo, (y_lo + y_hi) / 2, y_hi):
        out.append(f'<text x="{PAD - 6}" y="{y(tick) + 4:.1f}" text-anchor="end">{tick:{tick_format}}</text>')
    return out


def curve_svg(result: AgentGradResult) -> str:
    """Best validation score against metric calls, as a step line with a dot per improvement."""
    points = list(result.val_history)
    if not points:
        return "<p>No validation score was recorded.</p>"
    end = max(result.metric_calls, points[-1][0])
    tried = [(c, s) for c, s, accepted in candidate_positions(result) if not accepted]
    scores = [s for _, s in points + tried]
    lo, hi = min(scores), max(scores)
    if hi - lo < 0.1:
        lo, hi = max(0.0, lo - 0.05), hi + 0.05
    x, y = _scale(0, end or 1, PAD, WIDTH - 16), _scale(lo, hi, HEIGHT - PAD, 16)
    path, previous = [], None
    for calls, score in points + [(end, points[-1][1])]:
        if previous is not None:
            path.append(f"L{x(calls):.1f},{y(previous):.1f}")
        path.append(f"{'M' if not path else 'L'}{x(calls):.1f},{y(score):.1f}")
        previous = score
    dots = "".join(
        f'<circle cx="{x(c):.1f}" cy="{y(s):.1f}" r="4" fill="{COLORS[0]}"><title>{c} calls: {s:.4f}</title></circle>'
        for c, s in points
    )
    dots += "".join(
        f'<circle cx="{x(c):.1f}" cy="{y(s):.1f}" r="4" fill="none" stroke="{COLORS[3]}" stroke-width="1.5">'
        f"<title>rejected candidate at {c} calls: {s:.4f}</title></circle>"
        for c, s in tried
    )
    legend = (  # a line under the axis label
        f'<circle cx="{PAD}" cy="{HEIGHT + 8}" r="4" fill="{COLORS[0]}"/>'
        f'<text x="{PAD + 10}" y="{HEIGHT + 12}">best so far</text>'
        f'<circle cx="{PAD + 110}" cy="{HEIGHT + 8}" r="4" fill="none" stroke="{COLORS[3]}" stroke-width="1.5"/>'
        f'<text x="{PAD + 120}" y="{HEIGHT + 12}">candidate rejected on validation</text>'
    )
    ticks = "".join(
        f'<text x="{x(v):.1f}" y="{HEIGHT - PAD + 16}" text-anchor="middle">{v}</text>' for v in (0, end // 2, end)
    )
    body = "".join(_axes("metric calls", "best validation score", lo, hi)) + ticks
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT + 20}" font-size="12" '
        f'role="img" aria-label="validation curve">{body}'
        f'<path d="{" ".join(path)}" fill="none" stroke="{COLORS[0]}" stroke-width="2"/>{dots}{legend}</svg>'
    )


def attribution_svg(result: AgentGradResult) -> str:
    """Grouped bars: per round, the failures blamed on each predictor."""
    names, rows = attribution_table(result)
    if not rows or not names:
        return "<p>No round ran, so nothing was attributed.</p>"
    top = max(1, max(max(r) for r in rows))
    y = _scale(0, top, HEIGHT - PAD, 16)
    group = (WIDTH - 16 - PAD) / len(rows)
    bar = group * 0.8 / len(names)
    parts = _axes("round", "failures attributed", 0, top, ".3g")
    for r, row in enumerate(rows):
        left = PAD + r * group + group * 0.1
        parts.append(f'<text x="{left + group * 0.4:.1f}" y="{HEIGHT - PAD + 16}" text-anchor="middle">{r}</text>')
        for i, count in enumerate(row):
            parts.append(
                f'<rect x="{left + i * bar:.1f}" y="{y(count):.1f}" width="{bar:.1f}" '
                f'height="{y(0) - y(count):.1f}" fill="{COLORS[i % len(COLORS)]}">'
                f"<title>round {r}, {html.escape(names[i])}: {count}</title></rect>"
            )
    legend = "".join(
        f'<rect x="{WIDTH - 150}" y="{18 + 16 * i}" width="10" height="10" fill="{COLORS[i % len(COLORS)]}"/>'
        f'<text x="{WIDTH - 134}" y="{27 + 16 * i}">{html.escape(n)}</text>'
        for i, n in enumerate(names)
    )
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" font-size="12" '
        f'role="img" aria-label="attributions per predictor per round">{"".join(parts)}{legend}</svg>'
    )


def write_pngs(result: AgentGradResult, out_dir: Path) -> list[Path]:
    """The two charts as PNG files; needs matplotlib (``pip install matplotlib``)."""
    try:
        import matplotlib
    except ImportError:
        raise ImportError(
            "the PNG charts need matplotlib: pip install matplotlib (report.html has the same charts as SVG)"
        ) from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    if result.val_history:
        fig, ax = plt.subplots(figsize=(6.4, 3.2))
        calls = [c for c, _ in result.val_history] + [max(result.metric_calls, result.val_history[-1][0])]
        scores = [s for _, s in result.val_history] + [result.val_history[-1][1]]
        ax.step(calls, scores, where="post", color=COLORS[0], label="best so far")
        ax.plot(calls[:-1], scores[:-1], "o", color=COLORS[0])
        tried = [(c, s) for c, s, accepted in candidate_positions(result) if not accepted]
        if tried:
            ax.plot(*zip(*tried), "o", mfc="none", color=COLORS[3], label="candidate rejected on validation")
        ax.legend(fontsize=8)
        ax.set(xlabel="metric calls", ylabel="best validation score", title="Validation curve")
        fig.tight_layout()
        _save_png(fig, out_dir / CURVE_PNG)
        plt.close(fig)
        written.append(out_dir / CURVE_PNG)
    names, rows = attribution_table(result)
    if rows and names:
        fig, ax = plt.subplots(figsize=(6.4, 3.2))
        width = 0.8 / len(names)
        for i, name in enumerate(names):
            ax.bar(
                [r + i * width for r in range(len(rows))], [row[i] for row in rows], width, label=name, color=COLORS[i]
            )
        ax.set(xlabel="round", ylabel="failures attributed", title="Attributions per predictor")
        ax.set_xticks([r + 0.4 - width / 2 for r in range(len(rows))], [str(r) for r in range(len(rows))])
        ax.legend()
        fig.tight_layout()
        _save_png(fig, out_dir / ATTRIBUTION_PNG)
        plt.close(fig)
        written.append(out_dir / ATTRIBUTION_PNG)
    return written


def _save_png(fig: Any, path: Path) -> None:
    """A chart written atomically, like every file in ``log_dir``."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=120)
    atomic_write_bytes(path, buffer.getvalue())
