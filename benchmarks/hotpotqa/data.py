"""HotpotQA data: the offline distractor sample (shared data) or HotpotQA online; the BM25 corpus."""

from __future__ import annotations

import json
from pathlib import Path

import dspy

from benchmarks.common import data_file, split_examples

SAMPLE_FILE = ("hotpotqa", "hotpot_dev_distractor_sample.jsonl")


def sample_path() -> Path:
    return data_file(*SAMPLE_FILE)


def read_rows(path: Path | None = None) -> list[dict]:
    with open(path or sample_path(), encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def to_example(row: dict) -> dspy.Example:
    titles = list(dict.fromkeys(row["supporting_facts"]["title"]))
    return dspy.Example(
        id=row["id"],
        question=row["question"],
        answer=row["answer"],
        gold_titles=titles,
        level=row.get("level"),
        type=row.get("type"),
    ).with_inputs("question")


def pooled_corpus(rows: list[dict]) -> list[str]:
    """Every context paragraph of the rows, ``"title | text"``, one per distinct title (first seen)."""
    seen, corpus = set(), []
    for row in rows:
        ctx = row["context"]
        for title, sentences in zip(ctx["title"], ctx["sentences"]):
            if title in seen:
                continue
            seen.add(title)
            corpus.append(f"{title} | {''.join(sentences).strip()}")
    return corpus


def offline_splits(train: int, val: int, test: int, seed: int, path: Path | None = None):
    """Disjoint train/val/test from the offline sample, shuffled with ``seed``."""
    rows = read_rows(path)
    examples = [to_example(r) for r in rows]
    try:
        return split_examples(examples, [train, val, test], seed), rows
    except ValueError as exc:
        raise ValueError(
            f"{exc}: the offline HotpotQA sample has {len(examples)} questions; "
            "pass smaller --train/--val/--test (e.g. 50/50/52)"
        ) from exc


def online_splits(train: int, val: int, test: int, seed: int):
    """HotpotQA through ``dspy.datasets.HotPotQA`` (hard questions; needs ``datasets`` and network):
    train/val from its train portion, test from its held-out dev portion, each shuffled by DSPy with
    the given seeds. Gold titles are kept for the hints (``keep_details=True``)."""
    from dspy.datasets import HotPotQA

    ds = HotPotQA(
        train_seed=seed + 1,
        train_size=train + val,
        eval_seed=2023 + seed,
        dev_size=test,
        test_size=0,
        keep_details=True,
    )

    def convert(e):
        return dspy.Example(
            id=e.get("id"), question=e.question, answer=e.answer, gold_titles=sorted(e.get("gold_titles") or [])
        ).with_inputs("question")

    pool = [convert(e) for e in ds.train]
    return pool[:train], pool[train : train + val], [convert(e) for e in ds.dev]
