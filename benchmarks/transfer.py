"""Transfer targets: a program optimized on one benchmark, evaluated unchanged on an unseen one of the
same domain (the paper's transfer table).

* PUPA -> PUPA-TNB: the PUPA_TNB rows of the PUPA release (offline, shared data), through the same
  delegation program, untrusted model and judge.
* HotpotQA -> 2WikiMultiHopQA: the dev set of the 2WikiMultiHopQA release (online only; downloaded once
  into ``$AGENTGRAD_CACHE_DIR/2wikimultihopqa``), through the same multi-hop program over a BM25 corpus
  pooled from the chosen questions' context paragraphs (the 2WikiMultiHopQA questions come with their
  own paragraphs, as HotpotQA's distractor setting does).
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import dspy

from benchmarks.common import BM25Search, DataUnavailable, cache_dir, download_file, split_examples
from benchmarks.registry import Benchmark

#: source benchmark -> target name
TARGETS = {"pupa": "pupa-tnb", "hotpotqa": "2wikimultihopqa"}
PRETTY_TARGETS = {"pupa-tnb": "PUPA-TNB", "2wikimultihopqa": "2WikiMultiHopQA"}
#: The release linked from the 2WikiMultiHopQA repository (Alab-NII/2wikimultihop): train/dev/test JSON.
TWOWIKI_URL = "https://www.dropbox.com/s/ms2m13252h6xubs/data_ids_april7.zip?dl=1"
#: Target examples when --test does not say (the transfer table's evaluation set).
DEFAULT_SIZE = 300


@dataclass
class Target:
    """The target's examples and how to run and score a program there."""

    name: str
    examples: list[dspy.Example]
    make_program: Callable[[], dspy.Module]
    metric: Callable[..., Any]
    info: dict[str, Any] = field(default_factory=dict)


def _sample(examples: list, size: int | None, seed: int) -> list:
    if size is None or size >= len(examples):
        return list(examples)
    return split_examples(examples, [size], seed)[0]


def _pupa_tnb(bench: Benchmark, size: int | None, seed: int) -> Target:
    from benchmarks.pupa import load_subset

    rows = _sample(load_subset("tnb"), size, seed)
    info = {"source": "PUPA_TNB (shared CSV)", "size": len(rows), "split_seed": seed}
    return Target("pupa-tnb", rows, bench.make_program, bench.metric, info)


def _twowiki_dev() -> list[dict]:
    archive = download_file(
        TWOWIKI_URL, cache_dir() / "2wikimultihopqa" / "data_ids_april7.zip", what="2WikiMultiHopQA"
    )
    try:
        with zipfile.ZipFile(archive) as zf:
            name = next(n for n in zf.namelist() if n.endswith("dev.json"))
            return json.loads(zf.read(name))
    except (zipfile.BadZipFile, StopIteration, json.JSONDecodeError) as exc:
        raise DataUnavailable(
            f"{archive} does not hold the 2WikiMultiHopQA dev.json ({exc}); delete it and retry"
        ) from exc


def _as_hotpot_row(row: dict) -> dict:
    """2WikiMultiHopQA's ``[[title, sentences], ...]`` lists in HotpotQA's Hugging Face layout."""
    return {
        "id": row["_id"],
        "question": row["question"],
        "answer": row["answer"],
        "supporting_facts": {
            "title": [t for t, _ in row["supporting_facts"]],
            "sent_id": [i for _, i in row["supporting_facts"]],
        },
        "context": {"title": [t for t, _ in row["context"]], "sentences": [s for _, s in row["context"]]},
    }


def _twowiki(bench: Benchmark, size: int | None, seed: int) -> Target:
    from benchmarks.hotpotqa import HotpotMultiHop, answer_exact_match
    from benchmarks.hotpotqa.data import pooled_corpus, to_example

    rows = _sample([_as_hotpot_row(r) for r in _twowiki_dev()], size or DEFAULT_SIZE, seed)
    search = BM25Search(pooled_corpus(rows))
    info = {
        "source": "2WikiMultiHopQA dev (online release)",
        "corpus": "pooled context paragraphs of the chosen questions, BM25",
        "size": len(rows),
        "split_seed": seed,
    }
    return Target(
        "2wikimultihopqa", [to_example(r) for r in rows], lambda: HotpotMultiHop(search), answer_exact_match, info
    )


def load_target(source: str, bench: Benchmark, size: int | None = None, seed: int = 0) -> Target:
    """The transfer target of benchmark ``source`` (``TARGETS``), ``size`` examples (None: all of PUPA-TNB,
    300 of 2WikiMultiHopQA)."""
    if source not in TARGETS:
        raise ValueError(f"no transfer target for {source!r}; sources: {', '.join(TARGETS)}")
    return (_pupa_tnb if source == "pupa" else _twowiki)(bench, size, seed)
