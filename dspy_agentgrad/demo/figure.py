"""The main job's picture: the validation curve and the attributions per predictor, from ``summary.json``.

matplotlib is imported here only, on use: the optimizer itself does not need it.
"""

from __future__ import annotations

from pathlib import Path


def plot_summary(summary: dict, path: Path) -> Path | None:
    """Write the two-panel PNG to ``path``; returns None (and says why) when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install 'dspy-agentgrad[local]'): no picture written")
        return None
    fig, (curve, bars) = plt.subplots(1, 2, figsize=(11, 4.2))
    _validation_curve(curve, summary)
    _attributions(bars, summary)
    test = summary["test_score"]
    fig.suptitle(
        f"AgentGrad on {summary['task_lm']}: held-out {test['baseline']:.3f} -> {test['optimized']:.3f} "
        f"({summary['sizes']['test']} examples)",
        fontsize=11,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _validation_curve(ax, summary: dict) -> None:
    """Every validation pass against metric calls spent (start, kept, rejected) and the best score so far."""
    points = summary["validations"]
    best, xs, ys = None, [], []
    for p in points:
        if p["kind"] != "rejected":
            best = p["score"]
        xs.append(p["metric_calls"])
        ys.append(best)
    xs.append(summary["metric_calls"])
    ys.append(best)
    ax.step(xs, ys, where="post", color="tab:blue", label="best validation score")
    colors = {"start": "tab:blue", "kept": "tab:green", "rejected": "tab:red"}
    labels = {"start": "unoptimized", "kept": "rewrite kept", "rejected": "rewrite rejected on validation"}
    for kind in colors:
        chosen = [p for p in points if p["kind"] == kind]
        if chosen:
            ax.scatter(
                [p["metric_calls"] for p in chosen],
                [p["score"] for p in chosen],
                color=colors[kind],
                zorder=3,
                label=labels[kind],
            )
    ax.legend(fontsize=8, loc="lower right")
    ax.set_xlabel("metric calls")
    ax.set_ylabel(f"validation score ({summary['sizes']['val']} examples)")
    ax.set_ylim(0, 1)
    ax.set_title("validation curve", fontsize=10)


def _attributions(ax, summary: dict) -> None:
    """Per round, the failures blamed on each predictor and the hard cases, stacked."""
    rounds = summary["rounds"]
    names = list(dict.fromkeys(name for r in rounds for name in r["attributed"]))
    bottom = [0] * len(rounds)
    xs = [r["round"] for r in rounds]
    for name in names + ["hard cases"]:
        heights = [r["hard_cases"] if name == "hard cases" else r["attributed"].get(name, 0) for r in rounds]
        ax.bar(xs, heights, bottom=bottom, label=name, color="lightgray" if name == "hard cases" else None)
        bottom = [b + h for b, h in zip(bottom, heights)]
    for x, top, r in zip(xs, bottom, rounds):
        ax.text(x, top + 0.1, f"{r['failures']}/{r['batch_size']} failed", ha="center", fontsize=8)
    ax.set_ylim(0, max(bottom, default=0) * 1.25 + 1)
    ax.set_xticks(xs)
    ax.set_xlabel("round")
    ax.set_ylabel("failures")
    ax.set_title("who was at fault (sequential intervention)", fontsize=10)
    ax.legend(fontsize=8)
