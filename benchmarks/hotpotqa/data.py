"""HotpotQA data: the offline distractor sample (shared data) or HotpotQA online; the BM25 corpus."""

from __future__ import annotations

import json
from pathlib import Path

import dspy

from benchmarks.common import DataUnavailable, artifact_splits, data_file, split_examples

SAMPLE_FILE = ("hotpotqa", "hotpot_dev_distractor_sample.jsonl")


def sample_path() -> Path:
    return data_file(*SAMPLE_FILE)


def read_rows(path: Path | None = None) -> list[dict]:
    with open(path or sample_path(), encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def to_example(row: dict) -> dspy.Example:
    """An example with what the per-module feedback needs: the supporting facts (title, sentence index)
    and the supporting passages' sentences (``gold_context``). Every non-input field is a label that
    AgentGrad's leak guard checks, so descriptive fields (level, type: "hard", "bridge") are left out."""
    facts = row["supporting_facts"]
    titles = list(dict.fromkeys(facts["title"]))
    context = row.get("context") or {"title": [], "sentences": []}
    passages = dict(zip(context["title"], context["sentences"]))
    return dspy.Example(
        id=row["id"],
        question=row["question"],
        answer=row["answer"],
        gold_titles=titles,
        supporting_facts=[[t, int(i)] for t, i in zip(facts["title"], facts["sent_id"])],
        gold_context={t: list(passages[t]) for t in titles if t in passages},
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

    try:
        ds = HotPotQA(
            train_seed=seed + 1,
            train_size=train + val,
            eval_seed=2023 + seed,
            dev_size=test,
            test_size=0,
            keep_details=True,
        )
    except Exception as exc:  # no network, hub refused, `datasets` missing
        raise DataUnavailable(_online_error(exc)) from exc

    def convert(e):
        return dspy.Example(
            id=e.get("id"), question=e.question, answer=e.answer, gold_titles=sorted(e.get("gold_titles") or [])
        ).with_inputs("question")

    pool = [convert(e) for e in ds.train]
    return pool[:train], pool[train : train + val], [convert(e) for e in ds.dev]


def _online_error(exc: Exception) -> str:
    return (
        f"HotpotQA could not be loaded online ({type(exc).__name__}: {exc}). It needs the `datasets` package "
        "and network access to the Hugging Face hub; without them run with --source offline."
    )


def paper_splits():
    """The GEPA paper code's split: HotpotQA train (fullwiki config) through ``datasets``, cut 40/40/20
    into test/val/train and sampled down to 300/300/150 (:func:`benchmarks.common.artifact_splits`)."""
    try:
        from datasets import load_dataset

        rows = load_dataset("hotpot_qa", "fullwiki", split="train")
    except Exception as exc:
        raise DataUnavailable(_online_error(exc)) from exc
    return artifact_splits([to_example(dict(r)) for r in rows])
