"""PUPA privacy-conscious delegation benchmark (PAPILLON program of the GEPA paper, our own code).

Three LMs: the task LM is the trusted model (the two optimized predictors), ``untrusted`` answers the
redacted request, ``judge`` scores quality and leakage. Bind them before running: ``bench.bind_lms({
"untrusted": lm1, "judge": lm2})``.
"""

from __future__ import annotations

import dspy

from benchmarks.common import split_examples
from benchmarks.pupa.data import PAPER_SPLIT, load_subset
from benchmarks.pupa.metric import PupaJudge, make_hint, make_metric, module_feedback, pii_units
from benchmarks.pupa.program import PupaDelegation, SharedLM
from benchmarks.registry import Benchmark

__all__ = ["PupaDelegation", "PupaJudge", "load_benchmark", "load_subset", "module_feedback", "pii_units"]

LM_ROLES = {
    "untrusted": "the stronger external model that answers the redacted request (GEPA paper: GPT-4.1-mini)",
    "judge": "the LLM judge of quality and leakage (GEPA paper: GPT-4.1-mini)",
}

#: AgentGrad keeps no candidate whose privacy (1 - leakage) falls on validation: quality may not be bought with
#: leaked PII.
AGENTGRAD_OPTIONS = {"objective_guards": {"privacy": 0.0}}


def load_benchmark(
    train: int = PAPER_SPLIT[0],
    val: int = PAPER_SPLIT[1],
    test: int | None = PAPER_SPLIT[2],
    seed: int = 0,
    source: str = "offline",
    split: str = "seeded",
    **_ignored,
) -> Benchmark:
    """PUPA_New split into train/val/test: shuffled with ``seed``, or with ``split="paper"`` the GEPA
    paper's split (file order: the first ``train`` rows, the next ``val``, then ``test``; 111/111/221).
    PUPA_TNB is left out (for transfer: ``load_subset("tnb")``)."""
    test = PAPER_SPLIT[2] if test is None else test
    rows = load_subset("new", source=source)
    if split == "paper":
        if train + val + test > len(rows):
            raise ValueError(f"PUPA_New has {len(rows)} rows; {train}+{val}+{test} requested")
        trainset, valset, testset = rows[:train], rows[train : train + val], rows[train + val : train + val + test]
    else:
        trainset, valset, testset = split_examples(rows, [train, val, test], seed)
    judge = PupaJudge()
    untrusted = SharedLM(None)

    def bind_lms(lms: dict[str, dspy.BaseLM]) -> None:
        untrusted.lm, judge.lm = lms["untrusted"], lms["judge"]

    info = {
        "source": f"PUPA_New ({'shared CSV' if source == 'offline' else 'online'}); PUPA_TNB kept for transfer",
        "corpus": None,
        "split": "paper (file order)" if split == "paper" else f"seeded ({seed})",
        "split_seed": seed,
        "sizes": {"train": len(trainset), "val": len(valset), "test": len(testset)},
        "metric": "(quality + (1 - leakage)) / 2, LLM judge (quality both ways round; PII units leaked)",
    }
    return Benchmark(
        "pupa",
        trainset,
        valset,
        testset,
        lambda: PupaDelegation(untrusted),
        make_metric(judge),
        make_hint(judge),
        info,
        lm_roles=dict(LM_ROLES),
        bind_lms=bind_lms,
        optimizer_options={"agentgrad": dict(AGENTGRAD_OPTIONS)},
    )
