"""The zoo's numbers: per world and variant, what reaching GEPA's final score (and 90% of the best) cost, the
ratios to GEPA, and per variant the medians, the worst decile and the issue's targets, as JSON and Markdown.

A level a variant never reaches counts as an infinite ratio (it sorts last and fails every bound), one only GEPA
never reaches as 0, one neither reaches as 1; a world whose GEPA run failed is left out of the ratios. "Worst
decile" of a score is the mean of the worst 10% of worlds (at least one world); of a ratio, the 90th percentile
(the worst tenth lies above it).
"""

from __future__ import annotations

import json
import math
import random
import statistics
from collections import Counter
from pathlib import Path

from benchmarks.speed import TARGET_FRACTION, first_reach

INF = float("inf")
#: What reaching a level is measured in (keys of :func:`benchmarks.speed.first_reach`).
SPEND = ("seconds", "calls", "task_calls", "task_tokens")
HEAD_TO_HEAD = ("agentgrad", "paper", "gepa", "miprov2")


def task_tokens(entry: dict) -> int:
    task = entry["usage"].get("task", {})
    return task.get("prompt_tokens", 0) + task.get("completion_tokens", 0)


def after_best_share(entry: dict) -> float:
    """The share of the run's wall after its final best validation score was first reached."""
    hit = first_reach(entry, entry["val_score"])
    wall = max(entry["wall_time_s"], 1e-9)
    return max(0.0, wall - (hit["seconds"] or 0.0)) / wall


def _ratio(a: float | None, b: float | None) -> float:
    """``a / b`` where None means "never reached": INF when only ``a`` never is, 0 when only ``b`` never is,
    1 when neither is (no difference to report)."""
    if a is None or b is None:
        return 1.0 if a is None and b is None else INF if a is None else 0.0
    if not b:
        return 1.0 if not a else INF
    return a / b


def world_rows(record: dict) -> dict[str, dict]:
    """Per variant of one world: scores, totals, spend to each level and ratios to GEPA's."""
    runs = record["runs"]
    finals = [runs[n]["val_score"] for n in HEAD_TO_HEAD if n in runs]
    levels = {"target": TARGET_FRACTION * max(finals, default=0.0)}
    if "gepa" in runs:
        levels["gepa_final"] = runs["gepa"]["val_score"]
    rows = {}
    for name, entry in runs.items():
        row = {
            "val": entry["val_score"],
            "test": entry["test_score"],
            "metric_calls": entry["metric_calls"],
            "task_calls": entry["usage"].get("task", {}).get("calls", 0),
            "task_tokens": task_tokens(entry),
            "prompt_calls": entry["usage"].get("prompt", {}).get("calls", 0),
            "wall_s": entry["wall_time_s"],
            "after_best": after_best_share(entry),
            **{level: first_reach(entry, value) for level, value in levels.items()},
        }
        if "profile" in entry:
            row["profile"], row["stop_reason"] = entry["profile"], entry.get("stop_reason")
            # the budget's two counts (the task spend binds only under cap_task_spend), as shares of the budget
            row["budget_used"] = {k: entry.get(k, 0.0) / entry["budget"] for k in ("metric_calls", "task_spend")}
        rows[name] = row
    gepa = rows.get("gepa")
    for row in rows.values() if gepa else ():
        row["vs_gepa"] = {
            f"{level} {unit}": _ratio(row[level][unit], gepa[level][unit]) for level in levels for unit in SPEND
        }
        row["vs_gepa"] |= {
            "whole-run task tokens": _ratio(row["task_tokens"], gepa["task_tokens"]),
            "whole-run wall": _ratio(row["wall_s"], gepa["wall_s"]),
            "test - gepa": row["test"] - gepa["test"],
            "val - gepa": row["val"] - gepa["val"],
        }
    return rows


def worst_decile_mean(values: list[float]) -> float:
    """The mean of the lowest tenth of ``values`` (at least one)."""
    ordered = sorted(values)
    return statistics.fmean(ordered[: max(1, len(ordered) // 10)])


def p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.9 * len(ordered)) - 1)]


def variant_summary(worlds: list[dict], name: str) -> dict:
    """Medians, worst deciles and win rates of variant ``name`` over the worlds that ran it and GEPA."""
    both = [w for w in worlds if name in w["rows"] and "gepa" in w["rows"]]
    if not both:
        return {"worlds": 0}
    rows = [w["rows"][name] for w in both]
    ratios = {key: [r["vs_gepa"][key] for r in rows] for key in rows[0]["vs_gepa"]}
    noisy = [w["rows"][name]["vs_gepa"]["gepa_final seconds"] for w in both if w["noisy"]]
    tokens = ratios["whole-run task tokens"]
    return {
        "worlds": len(both),
        "median test": statistics.median(r["test"] for r in rows),
        "median test (gepa)": statistics.median(w["rows"]["gepa"]["test"] for w in both),
        "worst decile test": worst_decile_mean([r["test"] for r in rows]),
        "median val": statistics.median(r["val"] for r in rows),
        "test >= gepa": sum(d >= 0 for d in ratios["test - gepa"]) / len(both),
        "test > gepa": sum(d > 0 for d in ratios["test - gepa"]) / len(both),
        "val >= gepa": sum(d >= 0 for d in ratios["val - gepa"]) / len(both),
        "median after best": statistics.median(r["after_best"] for r in rows),
        "median wall s": statistics.median(r["wall_s"] for r in rows),
        "median task tokens": statistics.median(r["task_tokens"] for r in rows),
        "median": {k: statistics.median(v) for k, v in ratios.items()},
        "p90": {k: p90(v) for k, v in ratios.items()},
        "noisy worlds": len(noisy),
        "noisy median gepa_final seconds": statistics.median(noisy) if noisy else None,
        "max whole-run task tokens": max(tokens),
        "worlds within 1.2x tokens": sum(t <= 1.2 for t in tokens),
    }


def targets(s: dict) -> list[tuple[str, str, bool]]:
    """The issue's numbers for one variant's summary: (target, measured, met)."""
    n = s["worlds"]
    noisy = s["noisy median gepa_final seconds"]
    return [
        ("test >= GEPA's in >= 90% of worlds", f"{s['test >= gepa']:.0%}", s["test >= gepa"] >= 0.9),
        (
            "median test above GEPA's",
            f"{s['median test']:.3f} vs {s['median test (gepa)']:.3f}",
            s["median test"] > s["median test (gepa)"],
        ),
        (
            "median wall to GEPA's final <= 0.4x",
            f"{s['median']['gepa_final seconds']:.2f}x",
            s["median"]["gepa_final seconds"] <= 0.4,
        ),
        (
            "median task tokens to GEPA's final <= 0.6x",
            f"{s['median']['gepa_final task_tokens']:.2f}x",
            s["median"]["gepa_final task_tokens"] <= 0.6,
        ),
        (
            "noisy worlds: median wall to GEPA's final <= 0.6x",
            "–" if noisy is None else f"{noisy:.2f}x ({s['noisy worlds']} worlds)",
            noisy is not None and noisy <= 0.6,
        ),
        (
            "whole-run task tokens <= 1.2x GEPA's in every world",
            f"{s['worlds within 1.2x tokens']}/{n} worlds, max {s['max whole-run task tokens']:.2f}x",
            s["worlds within 1.2x tokens"] == n,
        ),
        ("median wall after the final best < 25%", f"{s['median after best']:.0%}", s["median after best"] < 0.25),
    ]


def load(out: Path) -> list[dict]:
    worlds = []
    for path in sorted((out / "worlds").glob("world*.json")):
        record = json.loads(path.read_text())
        worlds.append(
            {
                "index": record["world"]["index"],
                "label": record.get("label", ""),
                "noisy": record.get("noisy", False),
                "failed": record.get("failed", {}),
                "rows": world_rows(record),
            }
        )
    return worlds


def _f(value: float | None, digits: int = 2) -> str:
    if value is None:
        return "–"
    return "never" if value == INF else f"{value:.{digits}f}"


def markdown(worlds: list[dict], summaries: dict[str, dict], header: str) -> str:
    lines = [header, "", "## Targets (AgentGrad defaults vs GEPA)", "", "| target | measured | met |", "|---|---|---|"]
    if summaries.get("agentgrad", {}).get("worlds"):
        lines += [f"| {t} | {m} | {'yes' if ok else 'no'} |" for t, m, ok in targets(summaries["agentgrad"])]
    lines += ["", "## Per variant (ratios: variant / GEPA, median and 90th percentile over worlds)", ""]
    keys = ("gepa_final seconds", "gepa_final task_tokens", "target seconds", "target task_tokens")
    keys += ("whole-run task tokens", "whole-run wall")
    head = ["variant", "worlds", "median test", "worst decile test", "test >= GEPA", "median after best"]
    head += [f"{k} (med / p90)" for k in keys]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, s in summaries.items():
        if not s.get("worlds"):
            continue
        cells = [name, s["worlds"], _f(s["median test"], 3), _f(s["worst decile test"], 3)]
        cells += [f"{s['test >= gepa']:.0%}", f"{s['median after best']:.0%}"]
        cells += [f"{_f(s['median'][k])} / {_f(s['p90'][k])}" for k in keys]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    lines += ablation_lines(worlds, [n for n in summaries if n not in HEAD_TO_HEAD])
    lines += wall_lines(worlds)
    lines += ["", "## Per world (AgentGrad defaults; ratios to GEPA)", ""]
    head = ["world", "knobs", "test AG / paper / GEPA / MIPRO", "wall to GEPA final", "tokens to GEPA final"]
    head += ["whole-run tokens", "after best", "failed"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for w in worlds:
        rows = w["rows"]
        tests = " / ".join(_f(rows[n]["test"], 2) if n in rows else "–" for n in HEAD_TO_HEAD)
        ag = rows.get("agentgrad", {}).get("vs_gepa")
        cells = [w["index"], w["label"], tests]
        if ag:
            cells += [_f(ag["gepa_final seconds"]), _f(ag["gepa_final task_tokens"]), _f(ag["whole-run task tokens"])]
            cells += [f"{rows['agentgrad']['after_best']:.0%}"]
        else:
            cells += ["–"] * 4
        cells.append(", ".join(w["failed"]) or "")
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def bootstrap_better(pairs: list[tuple[float, float]], lower_is_better: bool = False, draws: int = 2000) -> float:
    """The share of paired bootstrap resamples of the worlds in which the first column's median beats the
    second's (ties count half): how sure the zoo is that the difference of medians is not world-sampling noise."""
    rng = random.Random(0)
    wins = 0.0
    for _ in range(draws):
        sample = [pairs[rng.randrange(len(pairs))] for _ in pairs]
        a, b = statistics.median(x for x, _ in sample), statistics.median(y for _, y in sample)
        wins += 0.5 if a == b else float((a < b) if lower_is_better else (a > b))
    return wins / draws


def ablation_lines(worlds: list[dict], names: list[str]) -> list[str]:
    """Each ablation against the defaults on the worlds that ran both, and what the rule says: a mechanism earns
    its default when the defaults have a higher median test score or a lower median wall to GEPA's final,
    without a lower worst decile of test scores. Per-world test differences are shown too (paired, same world)."""
    wall = "gepa_final seconds"
    lines = ["", "## Ablations (AgentGrad with one change, against the defaults on the same worlds)", ""]
    head = ["variant", "worlds", "median test (defaults)", "worst decile test (defaults)"]
    head += ["median wall to GEPA final (defaults)", "median tokens to GEPA final", "median whole-run tokens"]
    head += ["median after best", "test: defaults higher / lower", "P(defaults better): test / wall"]
    head += ["defaults earn it?"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name in names:
        paired = [w for w in worlds if name in w["rows"] and "agentgrad" in w["rows"] and "gepa" in w["rows"]]
        if not paired:
            continue
        s, base = variant_summary(paired, name), variant_summary(paired, "agentgrad")
        better = base["median test"] > s["median test"] or base["median"][wall] < s["median"][wall]
        keeps = better and base["worst decile test"] >= s["worst decile test"]
        diffs = [w["rows"]["agentgrad"]["test"] - w["rows"][name]["test"] for w in paired]
        cells = [name, len(paired), f"{_f(s['median test'], 3)} ({_f(base['median test'], 3)})"]
        cells += [f"{_f(s['worst decile test'], 3)} ({_f(base['worst decile test'], 3)})"]
        cells += [f"{_f(s['median'][wall])} ({_f(base['median'][wall])})"]
        cells += [_f(s["median"]["gepa_final task_tokens"]), _f(s["median"]["whole-run task tokens"])]
        cells += [f"{s['median after best']:.0%}", f"{sum(d > 0 for d in diffs)} / {sum(d < 0 for d in diffs)}"]
        tests = [(w["rows"]["agentgrad"]["test"], w["rows"][name]["test"]) for w in paired]
        walls = [(w["rows"]["agentgrad"]["vs_gepa"][wall], w["rows"][name]["vs_gepa"][wall]) for w in paired]
        cells.append(f"{bootstrap_better(tests):.2f} / {bootstrap_better(walls, lower_is_better=True):.2f}")
        cells.append("yes" if keeps else "no")
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return lines


def wall_lines(worlds: list[dict]) -> list[str]:
    """Where AgentGrad's wall and task-LM calls went (median phase shares), in the noisy worlds and the others."""
    title = "## Where AgentGrad's wall goes (median over worlds: `task X` share of task-LM calls, `wall X` of wall)"
    lines = ["", title, ""]
    groups = {"task LM samples or prompt LM forgets": True, "neither": False}
    keys = None
    for group, noisy in groups.items():
        profiles = [
            w["rows"]["agentgrad"]["profile"] for w in worlds if w["noisy"] == noisy and "agentgrad" in w["rows"]
        ]
        if not profiles:
            continue
        keys = keys or [k for k in profiles[0] if k.startswith(("wall", "task"))] + ["rounds", "candidates"]
        if len(lines) == 3:
            lines += ["| worlds | n | " + " | ".join(keys) + " |", "|---|---|" + "---|" * len(keys)]
        cells = [f"{statistics.median(p[k] for p in profiles):.0%}" for k in keys[:-2]]
        cells += [f"{statistics.median(p[k] for p in profiles):g}" for k in keys[-2:]]
        lines.append(f"| {group} | {len(profiles)} | " + " | ".join(cells) + " |")
    stops = Counter(
        (w["rows"]["agentgrad"].get("stop_reason") or "budget").split(" (")[0]
        for w in worlds
        if "agentgrad" in w["rows"]
    )
    lines += ["", "AgentGrad's stop reasons: " + ", ".join(f"{reason} ({n})" for reason, n in stops.most_common())]
    used = [w["rows"]["agentgrad"]["budget_used"] for w in worlds if "agentgrad" in w["rows"]]
    if used:
        shares = {k: statistics.median(u[k] for u in used) for k in ("metric_calls", "task_spend")}
        lines[-1] += f"; median metric calls {shares['metric_calls']:.0%} and task spend {shares['task_spend']:.0%}"
        lines[-1] += " of the budget"
    return lines


def plot(worlds: list[dict], path: Path) -> bool:
    """Per-world ratios to GEPA of AgentGrad's defaults and its paper preset (log scale); False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    series = (
        ("agentgrad", "gepa_final seconds", "wall to GEPA's final", "o"),
        ("agentgrad", "gepa_final task_tokens", "task tokens to GEPA's final", "s"),
        ("agentgrad", "whole-run task tokens", "whole-run task tokens", "^"),
        ("paper", "gepa_final seconds", "paper preset: wall to GEPA's final", "x"),
    )
    fig, ax = plt.subplots(figsize=(13, 4.5))
    cap = 20.0
    for name, key, title, marker in series:
        xs = [w["index"] for w in worlds if name in w["rows"] and "vs_gepa" in w["rows"][name]]
        ys = [min(w["rows"][name]["vs_gepa"][key], cap) for w in worlds if w["index"] in xs]
        ax.scatter(xs, ys, marker=marker, label=title, alpha=0.8)
    for level, style in ((0.4, ":"), (0.6, "--"), (1.0, "-"), (1.2, "-.")):
        ax.axhline(level, color="grey", linestyle=style, linewidth=0.8)
    ax.set_yscale("log")
    ax.set_xlabel("world")
    ax.set_ylabel(f"variant / GEPA (never reached drawn at {cap:g})")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title("AgentGrad / GEPA per zoo world (lines: 0.4, 0.6, 1, 1.2)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def summarize(out: Path, header: str) -> dict[str, dict]:
    """Write summary.json, summary.md and ratios.png under ``out``; return the per-variant summaries."""
    worlds = load(out)
    names = list(dict.fromkeys(n for w in worlds for n in w["rows"]))
    summaries = {name: variant_summary(worlds, name) for name in names if name != "gepa"}
    summaries["gepa"] = variant_summary(worlds, "gepa")
    keep = ("val", "test", "metric_calls", "task_calls", "task_tokens", "wall_s", "after_best", "vs_gepa")
    per_world = [
        {
            **{k: w[k] for k in ("index", "label", "noisy", "failed")},
            "rows": {n: {k: r.get(k) for k in keep} for n, r in w["rows"].items()},
        }
        for w in worlds
    ]  # the world files hold the rest (curves, phase shares)
    summary = {"variants": summaries, "worlds": per_world}
    (out / "summary.json").write_text(json.dumps(summary, separators=(",", ":"), default=str))
    (out / "summary.md").write_text(markdown(worlds, summaries, header))
    plot(worlds, out / "ratios.png")
    return summaries
