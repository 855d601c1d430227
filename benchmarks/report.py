"""Results files -> Markdown tables (like the paper's Table 1) and a validation-curve plot."""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from benchmarks.presets import gepa_variant
from benchmarks.speed import speed_table
from dspy_agentgrad.reporting.paired import PairedChange

PRETTY = {
    "hotpotqa": "HotpotQA",
    "hover": "HoVer",
    "ifbench": "IFBench",
    "pupa": "PUPA",
    "math": "MATH",
    "synthetic": "Synthetic",
}
OPT_PRETTY = {
    "baseline": "Baseline",
    "agentgrad": "AgentGrad",
    "gepa": "GEPA",
    "miprov2": "MIPROv2",
    "textgrad": "TextGrad",
    "agentgrad-plain": "AgentGrad (plain textual gradients)",
    "agentgrad+target": "AgentGrad (+ target identification)",
    "agentgrad+supervision": "AgentGrad (+ agent-level supervision)",
}
#: The paper's row order.
OPT_ORDER = (
    "baseline",
    "miprov2",
    "textgrad",
    "gepa",
    "agentgrad-plain",
    "agentgrad+target",
    "agentgrad+supervision",
    "agentgrad",
)


def write_json(path: Path, data: Any) -> None:
    """Atomic JSON write (a crash never leaves a half-written results file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=2, sort_keys=False)
        fh.write("\n")
    os.replace(tmp, path)


def order_optimizers(names: Iterable[str]) -> list[str]:
    names = list(dict.fromkeys(names))
    known = [n for n in OPT_ORDER if n in names]
    return known + sorted(n for n in names if n not in OPT_ORDER)


def ordered_benches(group: dict[str, dict[str, dict]]) -> list[str]:
    """The benchmarks of ``group`` in the paper's order, then any others by name."""
    return [b for b in PRETTY if b in group] + sorted(b for b in group if b not in PRETTY)


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.2f}"


def _gain(x: float | None, se: float | None = None) -> str:
    if x is None:
        return "–"
    return f"{100 * x:+.2f}" + ("" if se is None else f" ± {100 * se:.2f}")


def lm_label(results: dict) -> str:
    cfg = results.get("config", {})
    return f"task LM {cfg.get('task_lm', '?')}, prompt LM {cfg.get('prompt_lm', '?')}"


def merge_results(files: Iterable[dict]) -> dict[str, dict[str, dict[str, dict]]]:
    """{lm label: {benchmark: {optimizer: entry}}}; later files override earlier ones."""
    merged: dict[str, dict[str, dict[str, dict]]] = {}
    for results in files:
        group = merged.setdefault(lm_label(results), {})
        for bench, block in results.get("benchmarks", {}).items():
            for name, entry in (block.get("optimizers") or {}).items():
                if entry.get("status") == "done":
                    group.setdefault(bench, {})[name] = entry
    return merged


def score_table(group: dict[str, dict[str, dict]]) -> str:
    """Rows: optimizers; columns: benchmarks (test score, gain over baseline), average gain."""
    benches = ordered_benches(group)
    names = order_optimizers(n for b in benches for n in group[b])
    head = "| Optimizer | " + " | ".join(PRETTY.get(b, b) for b in benches) + " | Avg gain |"
    lines = [head, "|" + "---|" * (len(benches) + 2)]
    for name in names:
        cells, gains = [], []
        for bench in benches:
            entry = group[bench].get(name)
            if entry is None:
                cells.append("–")
                continue
            gain = entry.get("gain")
            cell = _pct(entry.get("test_score"))
            if name != "baseline" and gain is not None:
                cell += f" ({_gain(gain)})"
                gains.append(gain)
            cells.append(cell)
        avg = "–" if name == "baseline" or not gains else _gain(sum(gains) / len(gains))
        lines.append(f"| {OPT_PRETTY.get(name, name)} | " + " | ".join(cells) + f" | {avg} |")
    return "\n".join(lines)


def detail_table(group: dict[str, dict[str, dict]]) -> str:
    head = (
        "| Benchmark | Optimizer | Test | Gain | Val | Metric calls (budget) | Task LM calls / tokens | "
        "Prompt LM calls / tokens | Wall time (s) |"
    )
    lines = [head, "|" + "---|" * 9]
    for bench in ordered_benches(group):
        for name in order_optimizers(group[bench]):
            e = group[bench][name]
            usage = e.get("usage", {})
            task, prompt = usage.get("task", {}), usage.get("prompt", {})
            budget = e.get("budget")

            def tok(u):
                return f"{u.get('calls', 0)} / {u.get('prompt_tokens', 0) + u.get('completion_tokens', 0)}"

            lines.append(
                f"| {PRETTY.get(bench, bench)} | {OPT_PRETTY.get(name, name)} | {_pct(e.get('test_score'))} | "
                f"{_gain(e.get('gain'), e.get('gain_se')) if name != 'baseline' else '–'} | "
                f"{_pct(e.get('val_score'))} | "
                f"{e.get('metric_calls', '–')} ({budget if budget is not None else '–'}) | "
                f"{tok(task)} | {tok(prompt)} | "
                f"{e.get('wall_time_s', 0):.1f} |"
            )
    return "\n".join(lines)


def head_to_head(group: dict[str, dict[str, dict]], ours: str = "agentgrad") -> str:
    """``ours`` against every other optimizer, example by example on the same test examples: the difference in
    points, its standard error, and on how many examples it scored higher and lower ("" when no pair kept its
    per-example scores)."""
    lines = []
    for bench in ordered_benches(group):
        mine = (group[bench].get(ours) or {}).get("test_scores")
        for name in order_optimizers(group[bench]):
            theirs = group[bench][name].get("test_scores")
            if name == ours or mine is None or theirs is None or len(mine) != len(theirs):
                continue
            change = PairedChange.of(theirs, mine)
            if change.wins + change.losses == 0:
                verdict = "no difference"
            elif change.within_noise():
                verdict = "within noise (under two standard errors)"
            else:
                verdict = "beyond two standard errors"
            lines.append(
                f"| {PRETTY.get(bench, bench)} | {OPT_PRETTY.get(name, name)} | "
                f"{_gain(change.gain, change.standard_error)} | {change.wins} / {change.losses} / {change.ties} | "
                f"{verdict} |"
            )
    if not lines:
        return ""
    head = (
        f"| Benchmark | {OPT_PRETTY.get(ours, ours)} against | Difference (points ± s.e.) | "
        "Examples higher / lower / same | |"
    )
    return "\n".join([head, "|---|---|---|---|---|", *lines])


def markdown_report(results_list: list[dict]) -> str:
    merged = merge_results(results_list)
    out = ["# AgentGrad head-to-head results", ""]
    for label, group in merged.items():
        out += [
            f"## {label}",
            "",
            "Test score (%) and gain over the unoptimized program (points).",
            "",
            score_table(group),
            "",
            "### Details",
            "",
            "Gain ± one standard error of the per-example difference from the baseline on the same test examples.",
            "",
            detail_table(group),
            "",
        ]
        pairs = head_to_head(group)
        if pairs:
            out += ["### Head to head, example by example", "", pairs, ""]
    notes = []
    for results in results_list:
        cfg = results.get("config", {})
        for bench, block in results.get("benchmarks", {}).items():
            info = block.get("info") or {}
            if block.get("status") == "unavailable":
                notes.append(f"- {PRETTY.get(bench, bench)}: not run -- {block.get('error')}")
            elif info:
                notes.append(f"- {PRETTY.get(bench, bench)} ({lm_label(results)}): {setup_line(info, cfg, block)}")
    speed = [speed_table(r.get("benchmarks", {})) for r in results_list]
    if any(speed):
        out += ["## Time to quality", ""] + [t for t in speed if t] + [""]
    if notes:
        out += ["## Setup", ""] + notes + [""]
    return "\n".join(out)


def setup_line(info: dict, cfg: dict, block: dict) -> str:
    """Which data, split, corpus (and stemmer) and settings one benchmark's numbers come from."""
    corpus = f"corpus = {info.get('corpus')}"
    if info.get("corpus_note"):
        corpus += f" ({info['corpus_note']})"
    if info.get("corpus"):
        corpus += f", BM25 stemmer: {info.get('stemmer') or 'none'}"
    parts = [
        f"data = {info.get('source', '?')}",
        corpus,
        f"split {info.get('split') or 'seed ' + str(info.get('split_seed'))}",
        f"sizes {info.get('sizes')}",
        f"optimizer seed {cfg.get('seed')}",
        f"cache policy {cfg.get('cache')}",
    ]
    if cfg.get("preset"):
        parts.append(f"preset {cfg['preset']}")
    settings = block.get("settings") or {}
    budget = settings.get("max_metric_calls", cfg.get("max_metric_calls"))
    parts.append(f"budget {budget} metric calls" if budget else "budget: each optimizer's light setting")
    if "gepa" in (block.get("optimizers") or {}):
        parts.append(gepa_variant(settings.get("options", cfg.get("options") or {})))
    return "; ".join(parts)


def plot_curves(results_list: list[dict], path: Path) -> Path | None:
    """Best validation score against metric calls, one panel per (LM setting, benchmark); None (with a
    warning) when matplotlib, part of the ``[bench]`` extra, is not installed."""
    try:
        import matplotlib
    except ImportError:
        logging.getLogger(__name__).warning("matplotlib is not installed: no curve plot (pip install matplotlib)")
        return None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        (label, bench, runs) for label, group in merge_results(results_list).items() for bench, runs in group.items()
    ]
    n = max(1, len(panels))
    fig, axes = plt.subplots(1, n, figsize=(5.5 * n, 4), squeeze=False)
    for ax, (label, bench, runs) in zip(axes[0], panels):
        for name in order_optimizers(runs):
            entry = runs[name]
            curve = entry.get("curve") or []
            if name == "baseline":
                if entry.get("val_score") is not None:
                    ax.axhline(100 * entry["val_score"], linestyle="--", color="grey", label="Baseline")
                continue
            if not curve:
                continue
            xs = [c for c, _ in curve]
            ys = [100 * s for _, s in curve]
            ax.step(xs, ys, where="post", marker="o", markersize=3, label=OPT_PRETTY.get(name, name))
        low, high = ax.get_ylim()
        if high - low < 10:  # flat curves: show a readable band, not rounding noise
            middle = (low + high) / 2
            ax.set_ylim(max(-2, middle - 10), min(102, middle + 10))
        ax.set_title(f"{PRETTY.get(bench, bench)}\n{label}", fontsize=8)
        ax.set_xlabel("metric calls")
        ax.set_ylabel("best validation score (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    if not panels:
        axes[0][0].text(0.5, 0.5, "no finished runs", ha="center")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
