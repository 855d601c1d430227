"""The paper's ablation, transfer and wall-clock tables, built from a runner's ``results.json``, with the
paper's numbers beside ours where the paper gives them.

The paper's numbers are those of our summary of the AgentGrad paper (``shared/paper/
agentgrad_summary_zh.txt``, section "实验"); a cell the summary does not give is left empty, never guessed.
"""

from __future__ import annotations

from typing import Any

from benchmarks.report import OPT_PRETTY, PRETTY, order_optimizers
from benchmarks.transfer import PRETTY_TARGETS, TARGETS

TABLES = ("ablation", "transfer", "time")
PAPER_SOURCE = "the AgentGrad paper, as given in shared/paper/agentgrad_summary_zh.txt (Experiments)"

#: The ablation rows, each adding one component (the last is the full method).
ABLATION_ROWS = (
    ("agentgrad-plain", "Plain textual gradients"),
    ("agentgrad+target", "+ Target identification"),
    ("agentgrad+supervision", "+ Agent-level supervision"),
    ("agentgrad", "+ Semantic abstraction (full AgentGrad)"),
)
ABLATION_PAPER = (
    "The paper reports the ablation on HotpotQA and PUPA: each component improves on the plain baseline "
    "and the full method scores highest; our summary of the paper gives no numbers for its cells."
)
#: Wall clock in minutes, (benchmark, optimizer) -> minutes, where the paper states them.
PAPER_MINUTES = {("math", "agentgrad"): 88, ("math", "textgrad"): 126}
#: Optimizer time over AgentGrad's time, where the paper states it.
PAPER_SPEEDUP = {("hotpotqa", "gepa"): 3.2, ("ifbench", "gepa"): 3.0}
PAPER_TIME_NOTES = (
    "AgentGrad takes 136 minutes on average over the five benchmarks: 2.5x faster than the next fastest "
    "optimizer (GEPA) and 4.7x faster than TextGrad on average.",
    "HotpotQA and IFBench: AgentGrad under 2 hours, GEPA about 6 hours (3.2x and 3.0x).",
    "MATH: AgentGrad 88 minutes, TextGrad 126 minutes.",
)
#: AgentGrad's lead over the next best optimizer on the target, in points.
PAPER_TRANSFER_LEAD = {"2wikimultihopqa": 6.33, "pupa-tnb": 2.87}


def _entries(results: dict, bench: str) -> dict[str, dict]:
    optimizers = results.get("benchmarks", {}).get(bench, {}).get("optimizers", {})
    return {name: e for name, e in optimizers.items() if e.get("status") == "done"}


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.2f}"


def _benches(results: dict) -> list[str]:
    names = list(results.get("benchmarks", {}))
    return [b for b in PRETTY if b in names] + [b for b in names if b not in PRETTY]


# -- ablation ---------------------------------------------------------------------------------------
def ablation(results: dict) -> tuple[dict[str, Any], str]:
    """Test score of each ablation row per benchmark; whether each added component helped."""
    benches = _benches(results)
    rows = {
        name: {b: _entries(results, b).get(name, {}).get("test_score") for b in benches} for name, _ in ABLATION_ROWS
    }
    baseline = {b: _entries(results, b).get("baseline", {}).get("test_score") for b in benches}
    steps = {}
    for b in benches:
        scores = [rows[name][b] for name, _ in ABLATION_ROWS]
        steps[b] = [None if x is None or y is None else y - x for x, y in zip(scores, scores[1:])]
    data = {
        "table": "ablation",
        "baseline": baseline,
        "rows": rows,
        "added_component_gain": steps,
        "paper": ABLATION_PAPER,
        "paper_source": PAPER_SOURCE,
    }
    head = "| Variant | " + " | ".join(PRETTY.get(b, b) for b in benches) + " |"
    lines = ["## Ablation (test score, %)", "", head, "|" + "---|" * (len(benches) + 1)]
    lines.append("| Baseline (no optimization) | " + " | ".join(_pct(baseline[b]) for b in benches) + " |")
    for name, label in ABLATION_ROWS:
        lines.append(f"| {label} | " + " | ".join(_pct(rows[name][b]) for b in benches) + " |")
    lines += ["", f"Paper: {ABLATION_PAPER}", ""]
    for b in benches:
        gains = ", ".join("–" if g is None else f"{100 * g:+.2f}" for g in steps[b])
        lines.append(f"- {PRETTY.get(b, b)}: points added by each component in turn: {gains}")
    return data, "\n".join(lines) + "\n"


# -- transfer ---------------------------------------------------------------------------------------
def transfer(results: dict) -> tuple[dict[str, Any], str]:
    """Source and target test scores per optimizer; AgentGrad's lead over the next best on the target."""
    pairs = {}
    for bench in _benches(results):
        block = results["benchmarks"][bench].get("transfer")
        if bench not in TARGETS or block is None:
            continue
        scores = block.get("scores", {})
        others = [s["target"] for n, s in scores.items() if n not in ("agentgrad", "baseline")]
        lead = None
        if "agentgrad" in scores and others:
            lead = scores["agentgrad"]["target"] - max(others)
        pairs[bench] = {**block, "agentgrad_lead": lead, "paper_agentgrad_lead": PAPER_TRANSFER_LEAD[TARGETS[bench]]}
    data = {"table": "transfer", "pairs": pairs, "paper_source": PAPER_SOURCE}
    cols = list(pairs)
    head = "| Optimizer | " + " | ".join(f"{PRETTY[s]} → {PRETTY_TARGETS[TARGETS[s]]}" for s in cols) + " |"
    lines = [
        "## Transfer (target test score, %; source test score in brackets)",
        "",
        head,
        "|" + "---|" * (len(cols) + 1),
    ]
    names = order_optimizers(n for s in cols for n in pairs[s].get("scores", {}))
    for name in names:
        cells = []
        for s in cols:
            cell = pairs[s].get("scores", {}).get(name)
            cells.append("–" if cell is None else f"{_pct(cell['target'])} ({_pct(cell['source_test'])})")
        lines.append(f"| {OPT_PRETTY.get(name, name)} | " + " | ".join(cells) + " |")
    lead_cells = []
    for s in cols:
        ours = pairs[s]["agentgrad_lead"]
        lead_cells.append(
            f"{'–' if ours is None else f'{100 * ours:+.2f}'} (paper {pairs[s]['paper_agentgrad_lead']:+.2f})"
        )
    lines.append("| AgentGrad's lead over the next best | " + " | ".join(lead_cells) + " |")
    for s in cols:
        if pairs[s].get("status") != "done":
            lines.append(f"\n- {PRETTY[s]} → {PRETTY_TARGETS[TARGETS[s]]}: not run -- {pairs[s].get('error')}")
    return data, "\n".join(lines) + "\n"


# -- wall clock -------------------------------------------------------------------------------------
def wall_clock(results: dict) -> tuple[dict[str, Any], str]:
    """Minutes per optimizer per benchmark (the runs' own ``wall_time_s``) and each optimizer's time over
    AgentGrad's, with the paper's where it gives them."""
    benches = _benches(results)
    minutes = {
        b: {n: e["wall_time_s"] / 60 for n, e in _entries(results, b).items() if n != "baseline"} for b in benches
    }
    ratio = {
        b: {n: m / minutes[b]["agentgrad"] for n, m in minutes[b].items() if minutes[b].get("agentgrad")}
        for b in benches
    }
    data = {
        "table": "time",
        "minutes": minutes,
        "time_over_agentgrad": ratio,
        "paper_minutes": {f"{b}/{n}": m for (b, n), m in PAPER_MINUTES.items()},
        "paper_time_over_agentgrad": {f"{b}/{n}": r for (b, n), r in PAPER_SPEEDUP.items()},
        "paper_notes": list(PAPER_TIME_NOTES),
        "paper_source": PAPER_SOURCE,
    }
    names = order_optimizers(n for b in benches for n in minutes[b])
    head = "| Optimizer | " + " | ".join(PRETTY.get(b, b) for b in benches) + " | Avg |"
    lines = ["## Wall clock (minutes; the paper's in brackets where it gives them)", "", head]
    lines.append("|" + "---|" * (len(benches) + 2))
    for name in names:
        cells, known = [], [minutes[b][name] for b in benches if name in minutes[b]]
        for b in benches:
            m = minutes[b].get(name)
            paper = PAPER_MINUTES.get((b, name))
            cells.append(("–" if m is None else f"{m:.2f}") + (f" ({paper})" if paper is not None else ""))
        avg = f"{sum(known) / len(known):.2f}" + (" (136)" if name == "agentgrad" else "")
        lines.append(f"| {OPT_PRETTY.get(name, name)} | " + " | ".join(cells) + f" | {avg} |")
    lines += ["", "Time over AgentGrad's (x; the paper's in brackets):", "", head.replace(" | Avg |", " |")]
    lines.append("|" + "---|" * (len(benches) + 1))
    for name in names:
        if name == "agentgrad":
            continue
        cells = []
        for b in benches:
            r = ratio[b].get(name)
            paper = PAPER_SPEEDUP.get((b, name))
            cells.append(("–" if r is None else f"{r:.2f}x") + (f" ({paper}x)" if paper is not None else ""))
        lines.append(f"| {OPT_PRETTY.get(name, name)} | " + " | ".join(cells) + " |")
    lines += ["", "Paper:"] + [f"- {note}" for note in PAPER_TIME_NOTES]
    lines.append(
        "\nOurs: each optimizer's own run (the test evaluation excluded), on the machine, servers and load "
        "that ran it: compare rows of one results file, not with the paper's minutes."
    )
    return data, "\n".join(lines) + "\n"


BUILDERS = {"ablation": ablation, "transfer": transfer, "time": wall_clock}
