"""The main job's printed summary: what was blamed, what was tried, what was kept, and why."""

from __future__ import annotations

from ..reporting.results import why_unchanged


def _clip(text: object, width: int = 110) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= width else flat[: width - 3] + "..."


_TRIED = {
    "instructions": "a rewrite per cluster",
    "demos": "demonstrations per predictor, from all its clusters",
    "both": "demonstrations per predictor, then a rewrite per cluster",
}


def _demo_text(demo: dict) -> str:
    return " | ".join(f"{field}: {value}" for field, value in demo.items())


def _score(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _held_out_lines(test: dict, n: int) -> list[str]:
    """The held-out result and, example by example, how many rose and fell and whether that is within noise."""
    line = (
        f"Held-out score (token F1, {n} examples): {test['baseline']:.3f} -> {test['optimized']:.3f} "
        f"({test['gain']:+.3f}"
    )
    if "wins" not in test:  # a summary written before per-example scores were kept
        return [line + ")"]
    if test["wins"] + test["losses"] == 0:
        return [line + f"; the same on all {n} examples)"]
    line += f"; higher on {test['wins']}, lower on {test['losses']}"
    if test["standard_error"] is not None:
        line += f"; standard error {test['standard_error']:.3f}"
    lines = [line + ")"]
    if test["within_noise"]:
        lines += [
            f"  The change is under two standard errors: {n} examples cannot tell it from chance.",
            "  More held-out examples (--test) tell more; see docs/main-job.md.",
        ]
    return lines


def report(summary: dict) -> str:
    """The demo's closing text: what the run changed and what it cost, for a person at the terminal."""
    test, val, sizes = summary["test_score"], summary["val_score"], summary["sizes"]
    usage = summary["usage"]
    optimizer = usage["optimizer"]
    lines = [
        "",
        "=" * 78,
        *_held_out_lines(test, sizes["test"]),
        f"Validation score ({sizes['val']} examples): {val['initial']:.3f} -> {val['best']:.3f}",
        f"Time: {summary['wall_time_s']:.0f} s wall, {summary['cpu_time_s']:.0f} s CPU; "
        f"metric calls {summary['metric_calls']} (budget {summary['settings']['max_metric_calls']}); "
        f"stop: {summary['stop_reason']}",
        f"LM calls: optimizer task {optimizer['task']['calls']}, prompt roles {optimizer['prompt']['calls']}; "
        f"held-out evals {usage['baseline_eval']['calls']} + {usage['optimized_eval']['calls']}"
        + ("" if summary["lm_generations"] is None else f"; generations run {summary['lm_generations']}")
        + (
            ""
            if not summary.get("lm_replies_repaired")
            else f" ({summary['lm_replies_repaired']} cut at the token limit, closed by the grammar)"
        ),
    ]
    if summary["lm_generations"] == 0:
        lines.append(
            "Nothing was generated: every LM reply came from DSPy's cache (an earlier run with the same settings)."
        )
    lines += [
        "",
        "Blamed (sequential intervention, last predictor first; hint delivered as "
        f"{summary['settings']['hint_delivery']!r}, fix threshold {summary['settings']['fix_threshold']}):",
    ]
    for r in summary["rounds"]:
        blamed = ", ".join(f"{name} {n}" for name, n in r["attributed"].items()) or "nobody"
        lines.append(
            f"  round {r['round']}: {r['failures']}/{r['batch_size']} failed -> {blamed}; "
            f"{r['hard_cases']} hard case(s); {r['gradients']} gradient(s) -> {r['clusters']} cluster(s) "
            f"(min size {r['min_cluster_size']}), {r['waiting']} waiting"
        )
    for b in summary["blamed"][:4]:
        field = next(iter(b["original"]), "")
        lines.append(
            f"    e.g. {b['predictor']} on {b['question']!r}: {_clip(b['original'].get(field), 50)!r} -> "
            f"with hint {_clip(b['with_hint'].get(field), 50)!r}"
        )
    lines += [
        "",
        f"Tried ({_TRIED[summary['settings'].get('candidates', 'instructions')]}; "
        "kept only if better on its cluster, then on validation):",
    ]
    if not summary["candidates"]:
        lines.append("  nothing")
    for c in summary["candidates"]:
        verdict = "KEPT" if c["accepted"] else f"rejected: {c['reason']}"
        demos = c.get("kind") == "demos"
        lines += [
            f"  round {c['round']}, {c['predictor']}, {'demonstrations' if demos else 'rewrite'}, cluster of "
            f"{c['cluster_size']}: cluster {_score(c['cluster_score_before'])} -> {_score(c['cluster_score_after'])}, "
            f"validation {_score(c['val_score'])} -> {verdict}",
        ]
        if demos:
            lines += [f"    demo:     {_clip(_demo_text(d))}" for d in c["demos"] or []]
        else:
            lines += [f"    gradient: {_clip(c['gradient'])}", f"    rewrite:  {_clip(c['instruction'])}"]
    lines.append("")
    kept = [c for c in summary["candidates"] if c["accepted"]]
    if kept:
        lines.append("Kept:")
        for name, text in summary["final_instructions"].items():
            if text != summary["initial_instructions"][name]:
                lines.append(f"  {name}: {_clip(text, 200)}")
        for name, demos in summary.get("final_demos", {}).items():
            lines.append(f"  {name}: {len(demos)} demonstration(s) from its pseudo-labels")
            lines += [f"    {_clip(_demo_text(d), 100)}" for d in demos]
    else:
        lines.append(
            "Kept: nothing; the program is unchanged: "
            + why_unchanged(summary["rounds"], summary["candidates"], summary["stop_reason"])
        )
    lines.append("=" * 78)
    return "\n".join(lines)
