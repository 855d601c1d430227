"""A synthetic multi-agent benchmark: a chain of lookup steps with latent, instruction-fixable defects.

Run it with the simulated LM (``--task-lm synthetic --prompt-lm synthetic``, see
:mod:`benchmarks.synthetic.world`). Data are generated from the split seed: each example is a
case whose question lists candidate record keys; the first step picks the case's key, every
later step must pass it on, the last step answers it. Defects (two per step) strike with
different frequencies (geometric, most frequent first, spread over the steps in a seeded order);
an example may carry several (multi-fault), none, or be unfixable. ``SYNTH_PREDICTORS`` in the
environment sets the number of steps (default 4), ``SYNTH_REWORD`` how the LM's wording varies
(``repeat``, ``intermediate``, ``all``; see :mod:`benchmarks.synthetic.world`): in ``all`` every
step is a ``dspy.ChainOfThought`` and the program returns the last step's reasoning with its answer.
``SYNTH_OVERREACH`` the share of defects whose fix phrase also breaks other examples (default 0), and
``SYNTH_HINT_RATE`` the share of (example, step) pairs where a hinted faulty step follows its hint
(default 0.8; a weaker LM follows fewer; see :mod:`benchmarks.synthetic.world`).
"""

from __future__ import annotations

import functools
import os
import random

import dspy

from benchmarks.registry import Benchmark
from benchmarks.synthetic.world import (
    HINT_FIX_RATE,
    LAST_FIELD,
    REWORD_MODES,
    decode_ticket,
    defect_name,
    encode_ticket,
    stable_hash,
)

__all__ = ["LookupChain", "hint", "load_benchmark", "make_examples", "metric"]

DEFAULT_STEPS = 4
TOP_FREQUENCY = 0.30
FREQUENCY_DECAY = 0.72
UNFIXABLE_RATE = 0.08
CANDIDATES = 4


def _share(name: str, default: str) -> float:
    """The share in environment variable ``name`` (``default`` when unset), checked to lie in [0, 1]."""
    text = os.environ.get(name, default)
    try:
        share = float(text)
    except ValueError:
        share = -1.0
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"{name} must be a share between 0 and 1; got {text!r}")
    return share


def overreach_share() -> float:
    """The share of defects whose fix overreaches in this process (``SYNTH_OVERREACH``, default 0), checked."""
    return _share("SYNTH_OVERREACH", "0")


def hint_rate() -> float:
    """The share of (example, step) pairs where a hinted faulty step follows its hint in this process
    (``SYNTH_HINT_RATE``, default ``HINT_FIX_RATE``), checked."""
    return _share("SYNTH_HINT_RATE", str(HINT_FIX_RATE))


def reword_mode() -> str:
    """The rewording mode of this process (``SYNTH_REWORD``, default ``repeat``), checked."""
    mode = os.environ.get("SYNTH_REWORD", "repeat")
    if mode not in REWORD_MODES:
        raise ValueError(f"SYNTH_REWORD must be one of {', '.join(REWORD_MODES)}; got {mode!r}")
    return mode


def step_fields(n_steps: int) -> list[str]:
    return [f"note{k}" for k in range(n_steps - 1)] + [LAST_FIELD]


class LookupChain(dspy.Module):
    """``step0`` (question -> note0), ``step1`` (question, note0 -> note1), ..., last step -> answer.

    ``chain_of_thought``: every step a ``dspy.ChainOfThought``, and the program returns the last
    step's prediction (its reasoning with the answer), as a ChainOfThought program usually does."""

    def __init__(self, n_steps: int = DEFAULT_STEPS, chain_of_thought: bool = False):
        super().__init__()
        self.fields = step_fields(n_steps)
        module = dspy.ChainOfThought if chain_of_thought else dspy.Predict
        for k, field in enumerate(self.fields):
            inputs = "question" if k == 0 else f"question, {self.fields[k - 1]}"
            setattr(self, f"step{k}", module(f"{inputs} -> {field}"))

    def forward(self, question: str) -> dspy.Prediction:
        note, out = None, None
        for k, field in enumerate(self.fields):
            kwargs = {"question": question} if k == 0 else {"question": question, self.fields[k - 1]: note}
            out = getattr(self, f"step{k}")(**kwargs)
            note = out[field]
        return dspy.Prediction(**dict(out.items())) if "reasoning" in out else dspy.Prediction(answer=note)


def defect_frequencies(n_steps: int, seed: int) -> dict[int, float]:
    """Defect bit -> probability that an example carries it; frequent defects land on any step."""
    bits = list(range(2 * n_steps))
    random.Random(f"synthetic-defects-{seed}").shuffle(bits)
    return {bit: TOP_FREQUENCY * FREQUENCY_DECAY**rank for rank, bit in enumerate(bits)}


def make_examples(
    count: int, n_steps: int, seed: int, first_case: int = 0, absent: frozenset[int] = frozenset()
) -> list[dspy.Example]:
    """``count`` seeded cases; ``absent``: defect bits no case of this split carries (a defect the split never
    shows, as a validation set too small to hold every failure mode)."""
    rng = random.Random(f"synthetic-data-{seed}-{first_case}")
    frequencies = defect_frequencies(n_steps, seed)
    out = []
    for case in range(first_case, first_case + count):
        keys = [f"k{stable_hash(f'{seed}:{case}:{j}') % 0xFFFFF:05x}" for j in range(CANDIDATES)]
        defects = [bit for bit, p in sorted(frequencies.items()) if rng.random() < p and bit not in absent]
        unfixable = rng.random() < UNFIXABLE_RATE
        question = (
            f"Case {case}: which record belongs to this case? candidates: {' '.join(keys)} "
            f"(ticket {encode_ticket(case, defects, unfixable)})"
        )
        out.append(dspy.Example(question=question, answer=keys[case * 7 % CANDIDATES]).with_inputs("question"))
    return out


def metric(gold, pred, trace=None, pred_name=None, pred_trace=None) -> dspy.Prediction:
    got = str(getattr(pred, "answer", "") or "").strip()
    if got == gold.answer:
        return dspy.Prediction(score=1.0, feedback="Correct record key.")
    return dspy.Prediction(score=0.0, feedback=f"Wrong: expected the record key {gold.answer}, got {got!r}.")


def hint(example, pred_name: str, prediction, feedback: str) -> str:
    return f"A correct run ends with the record key {example.answer}. Make sure your step passes it on."


def describe(examples: list[dspy.Example], n_steps: int) -> dict:
    """Counts of what the split holds (for the results file): clean, multi-fault, unfixable, per defect."""
    per_defect: dict[str, int] = {}
    multi = unfixable = clean = 0
    fields = step_fields(n_steps)
    for ex in examples:
        _case, bits, bad = decode_ticket(ex.question)
        unfixable += bad
        multi += len({b // 2 for b in bits}) > 1
        clean += not bits and not bad
        for bit in bits:
            name = defect_name(fields[bit // 2], bit % 2)
            per_defect[name] = per_defect.get(name, 0) + 1
    return {"clean": clean, "multi_step_faults": multi, "unfixable": unfixable, "defects": per_defect}


def load_benchmark(
    train: int = 50, val: int = 50, test: int | None = 100, seed: int = 0, n_steps: int | None = None, **_ignored
) -> Benchmark:
    n_steps = n_steps or int(os.environ.get("SYNTH_PREDICTORS", DEFAULT_STEPS))
    reword = reword_mode()
    if not 1 <= n_steps <= 8:
        raise ValueError(f"the synthetic benchmark supports 1 to 8 steps; got {n_steps}")
    test = 100 if test is None else test
    if train + val + test > 4096:
        raise ValueError("the synthetic benchmark holds at most 4096 examples (train + val + test)")
    trainset = make_examples(train, n_steps, seed)
    valset = make_examples(val, n_steps, seed, first_case=train)
    testset = make_examples(test, n_steps, seed, first_case=train + val)
    info = {
        "source": "synthetic (benchmarks/synthetic): generated from the split seed",
        "corpus": None,
        "steps": n_steps,
        "reword": reword,
        "split_seed": seed,
        "sizes": {"train": train, "val": val, "test": test},
        "metric": "exact record key",
        "val_profile": describe(valset, n_steps),
    }
    return Benchmark(
        "synthetic",
        trainset,
        valset,
        testset,
        functools.partial(LookupChain, n_steps, chain_of_thought=reword == "all"),
        metric,
        hint,
        info,
    )
