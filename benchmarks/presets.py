"""``--preset paper``: the settings of the papers' tables, per benchmark.

Budgets are the GEPA paper's metric-call budgets (every optimizer gets the same one); splits are the
GEPA paper code's where the data allow (see each :class:`PaperSetting`'s ``offline``). GEPA runs without
merge (the GEPA paper's main "GEPA" rows; "GEPA+Merge" is its variant); MIPROv2 gets 18 instruction
candidates as in the paper's MIPROv2 runs, and an error budget as large as its metric-call budget, so a
long API run is never aborted by DSPy's default of ten errors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

PRESETS = ("paper",)


@dataclass(frozen=True)
class PaperSetting:
    """One benchmark's cell of the paper setup."""

    budget: int
    sizes: tuple[int, int, int]
    #: What the loader's ``split="paper"`` does (online, with the paper's data).
    split: str
    #: What differs when the run uses the offline data.
    offline: str
    #: Sizes when the offline data cannot hold the paper's (None: the paper's sizes fit).
    offline_sizes: tuple[int, int, int] | None = None
    loader: dict[str, Any] = field(default_factory=dict)


PAPER = {
    "hotpotqa": PaperSetting(
        6871,
        (150, 300, 300),
        "HotpotQA train (fullwiki): test = first 40%, val = next 40%, train = last 20%, each sampled down "
        "to 300/300/150 with random.Random(1); Wikipedia 2017 abstracts, BM25 with the English stemmer",
        "152-question dev distractor sample, seeded 50/50/52 split; pooled context paragraphs as corpus "
        "(1,510, far easier than the 5M abstracts)",
        offline_sizes=(50, 50, 52),
    ),
    "hover": PaperSetting(
        7051,
        (150, 300, 300),
        "HoVer train, 3-hop claims, shuffled with random.Random(0), then the 40/40/20 cut sampled down to "
        "300/300/150 with random.Random(1); Wikipedia 2017 abstracts, BM25 with the English stemmer",
        "the same procedure on the dev release (1,835 3-hop claims) instead of train (--source online "
        "downloads train); the corpus must be downloaded once (there is none offline)",
    ),
    "ifbench": PaperSetting(
        3593,
        (150, 300, 294),
        "GEPA's IFBench train file: val = its first 300 prompts, train = prompts 300-599 sampled down to "
        "150 with random.Random(1); test = all 294 IFBench test prompts",
        "the IFEval prompts (541) stand in for GEPA's IFBench train file (same procedure: val = first 300, "
        "train = the other 241 sampled to 150); test is the paper's exact file",
    ),
    "pupa": PaperSetting(
        2426,
        (111, 111, 221),
        "PUPA_New in file order: 111 train, 111 val, 221 test; untrusted and judge LM GPT-4.1-mini",
        "the PUPA_New CSV of the PAPILLON repository (assumed in the Hugging Face order); untrusted and "
        "judge LM: what --untrusted-lm/--judge-lm name (default: the task LM)",
    ),
}


def optimizer_options(budget: int) -> dict[str, dict[str, Any]]:
    """Per-optimizer options of the paper setup (``--options`` given by the user override these)."""
    return {
        "gepa": {"use_merge": False},
        "miprov2": {"num_candidates": 18, "max_errors": budget},
    }


def merge_options(preset: dict[str, dict], user: dict[str, dict]) -> dict[str, dict]:
    """The preset's options per optimizer, each key overridden by the user's."""
    names = set(preset) | set(user)
    return {name: {**preset.get(name, {}), **user.get(name, {})} for name in names}


def gepa_variant(options: dict[str, dict]) -> str:
    """The GEPA variant an options dict runs (dspy.GEPA merges unless told not to)."""
    return "GEPA+Merge" if options.get("gepa", {}).get("use_merge", True) else "GEPA (no merge)"
