"""PUPA data: PUPA_New (train/val/test, as in the GEPA paper) and PUPA_TNB (kept for transfer).

Offline: the CSV files of the shared data folder. Online: the Hugging Face dataset ``Columbia-NLP/PUPA``
(what the GEPA paper's code loads) when ``datasets`` is installed, else the CSV files of the PAPILLON
repository on GitHub, cached under ``$AGENTGRAD_CACHE_DIR/pupa``.
"""

from __future__ import annotations

import csv
from pathlib import Path

import dspy

from benchmarks.common import DataUnavailable, cache_dir, data_file, download_file

SUBSETS = {"new": "PUPA_New.csv", "tnb": "PUPA_TNB.csv"}
GITHUB_CSV = "https://raw.githubusercontent.com/Columbia-NLP-Lab/PAPILLON/main/pupa/{name}"
HF_DATASET = ("Columbia-NLP/PUPA", {"new": "pupa_new", "tnb": "pupa_tnb"})
#: The GEPA paper's split of PUPA_New, in file order: 111 train, 111 val, 221 test.
PAPER_SPLIT = (111, 111, 221)


def to_example(row: dict) -> dspy.Example:
    """The fields the GEPA paper's code keeps (every other field would count as a label)."""
    return dspy.Example(
        user_query=row["user_query"], target_response=row["target_response"], pii_str=row["pii_units"] or ""
    ).with_inputs("user_query")


def read_csv(path: Path) -> list[dspy.Example]:
    with open(path, encoding="utf-8", newline="") as fh:
        return [to_example(row) for row in csv.DictReader(fh)]


def _online_rows(subset: str) -> list[dspy.Example]:
    try:
        from datasets import load_dataset
    except ImportError:
        name = SUBSETS[subset]
        return read_csv(download_file(GITHUB_CSV.format(name=name), cache_dir() / "pupa" / name, what="PUPA"))
    repo, configs = HF_DATASET
    try:
        rows = load_dataset(repo, configs[subset])["train"]
    except Exception as exc:  # no network, hub refused
        raise DataUnavailable(f"could not load the PUPA dataset {repo} ({configs[subset]}) online: {exc}") from exc
    return [to_example(dict(r)) for r in rows]


def load_subset(subset: str = "new", source: str = "offline", path: Path | None = None) -> list[dspy.Example]:
    """All rows of PUPA_New (``"new"``) or PUPA_TNB (``"tnb"``), in file order."""
    if subset not in SUBSETS:
        raise ValueError(f"unknown PUPA subset {subset!r} (new, tnb)")
    if path is not None or source == "offline":
        return read_csv(path or data_file("pupa", SUBSETS[subset]))
    if source == "online":
        return _online_rows(subset)
    raise ValueError(f"unknown source {source!r} (offline, online)")
