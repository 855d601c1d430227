"""MATH data: MATH-500 (the public 500-problem test subset of Hendrycks et al.'s MATH, as released on
Hugging Face) online, or the small offline fixture of problems written for this repository's tests.

Online, the release's ``test.jsonl`` is downloaded once into ``$AGENTGRAD_CACHE_DIR/math``; with no
network that fails with a clear error (there is no offline copy of MATH here).
"""

from __future__ import annotations

import json
from pathlib import Path

import dspy

from benchmarks.common import cache_dir, download_file

MATH500_URL = "https://huggingface.co/datasets/HuggingFaceH4/MATH-500/resolve/main/test.jsonl"
FIXTURE = Path(__file__).with_name("fixture.jsonl")


def to_example(row: dict) -> dspy.Example:
    """Problem as the input; reference answer and solution as labels (the metric's feedback quotes them)."""
    return dspy.Example(
        problem=row["problem"], answer=str(row["answer"]), solution=row.get("solution", "")
    ).with_inputs("problem")


def read_jsonl(path: Path) -> list[dspy.Example]:
    with open(path, encoding="utf-8") as fh:
        return [to_example(json.loads(line)) for line in fh if line.strip()]


def load_problems(source: str = "offline") -> list[dspy.Example]:
    """``"offline"``: the fixture (30 problems); ``"online"``: MATH-500 (500 problems)."""
    if source == "offline":
        return read_jsonl(FIXTURE)
    if source == "online":
        return read_jsonl(download_file(MATH500_URL, cache_dir() / "math" / "math500_test.jsonl", what="MATH-500"))
    raise ValueError(f"unknown source {source!r} (offline, online)")
