"""A world whose LM rewords every output with its prompt: how many pseudo-labels land on blameless predictors.

The 3-predictor world of tests/world.py, except that every task output carries a tag derived from the
whole prompt (instruction, inputs, hint), the way an API model words its answer differently whenever
its prompt changes, and that whether a hinted faulty predictor follows its hint depends on the wording
of its inputs. A hint on a blameless upstream predictor then changes nothing that matters, yet it
rewords that predictor's output and so can make a downstream predictor follow its own hint. Run:

    PYTHONPATH=$PWD python tests/rewording_sim.py [--seeds 6] [--follow 0.7] [--synthetic]

It prints, for outputs plain and reworded, the pseudo-labels of one attribution per seed, how many
went to a predictor the example's kind does not name (blameless), and the metric calls. ``--synthetic``
counts the same on the synthetic benchmark's world in its rewording modes (3 and 6 steps, 4 seeds of 40
training examples), where hint-following does not depend on wording.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import zlib
from pathlib import Path

import dspy

sys.path.insert(0, str(Path(__file__).parent))
from world import Pipeline, World, feedback_metric, make_data, retrieve, world_lm  # noqa: E402

from dspy_agentgrad import AgentGrad  # noqa: E402
from dspy_agentgrad.config import AgentGradConfig
from dspy_agentgrad.program.hint_delivery import HINT_FIELD  # noqa: E402
from dspy_agentgrad.testing import FakeCall, fake_lm  # noqa: E402

TRAIN = {"extract+notes": 6, "notes+answer": 5, "extract+answer": 5, "extract": 2, "notes": 2, "answer": 2}


class RewordingWorld(World):
    """World whose outputs are reworded by a digest of the prompt and whose hint-following hashes the inputs."""

    def __init__(self, reword: bool = True, **options):
        super().__init__(**options)
        self.reword = reword

    def _follows(self, name: str, call: FakeCall) -> bool:
        wording = sorted((k, v) for k, v in call.inputs.items() if k != HINT_FIELD)
        return zlib.crc32(f"{name}:{wording}".encode()) % 1000 < self.hint_follow_rate * 1000

    def __call__(self, call: FakeCall):
        out = super().__call__(call)
        if not self.reword or "current_instruction" in call.inputs:
            return out
        tag = zlib.crc32(f"{call.instructions}|{sorted(call.inputs.items())}".encode()) % 997
        return {k: f"{v} ~{tag}" for k, v in out.items()}


class WordingPipeline(Pipeline):
    """The pipeline of tests/world.py reading the meaning (first word) of reworded outputs."""

    def forward(self, question):
        raw = self.extract(question=question).keyword
        keyword = raw.split()[0]
        notes = self.notes(question=question, passages=f"{retrieve(keyword)} (query: {raw})").notes
        answer = self.answer(question=question, notes=notes).answer
        return dspy.Prediction(answer=answer.split()[0], keyword=keyword)


def kind(example: dspy.Example) -> list[str]:
    """The predictors at fault on an example."""
    return re.match(r"id\d+ kind=([\w+]+)", example.question).group(1).split("+")


def counting(metric):
    """``metric``, and the list that gets one item per call of it."""
    calls: list[int] = []

    def counted(*args, **kwargs):
        calls.append(1)
        return metric(*args, **kwargs)

    return counted, calls


def attribute(reword: bool, seed: int, follow: float = 0.7):
    """One attribution of a batch in the world: (predictor, example) per pseudo-label, and the metric calls."""
    dspy.configure(lm=world_lm(RewordingWorld(reword, hint_follow_rate=follow)))
    metric, calls = counting(feedback_metric)
    optimizer = AgentGrad(
        metric, auto=None, seed=seed, config=AgentGradConfig.from_options(max_rounds=1, progress=False)
    )
    report = optimizer.attribute(WordingPipeline(), make_data(TRAIN, start=seed * 100))
    labels = [(name, r.example) for name, records in report.attributed.items() for r in records]
    return labels, len(calls)


def synthetic(steps: int, mode: str, seeds: int = 4) -> tuple[int, int, int]:
    """Pseudo-labels, those on a step without a defect of the example, and metric calls, over one attribution
    of 40 training examples per seed in the synthetic world."""
    os.environ["SYNTH_PREDICTORS"], os.environ["SYNTH_REWORD"] = str(steps), mode
    from benchmarks.synthetic import load_benchmark, step_fields
    from benchmarks.synthetic.world import SyntheticWorld, decode_ticket

    labels = blameless = calls = 0
    for seed in range(seeds):
        bench = load_benchmark(train=40, val=4, test=0, seed=seed, n_steps=steps)
        dspy.configure(lm=fake_lm(SyntheticWorld(task_s=0, prompt_s=0, reword=mode)))
        metric, scored = counting(bench.metric)
        optimizer = AgentGrad(
            metric,
            hint_fn=bench.hint,
            auto=None,
            seed=seed,
            config=AgentGradConfig.from_options(max_rounds=1, progress=False),
        )
        report = optimizer.attribute(bench.make_program(), bench.trainset)
        for records in report.attributed.values():
            for record in records:
                step = next(k for k, f in enumerate(step_fields(steps)) if f in record.corrected)
                labels += 1
                blameless += all(bit // 2 != step for bit in decode_ticket(record.example.question)[1])
        calls += len(scored)
    return labels, blameless, calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=6)
    parser.add_argument("--follow", type=float, default=0.7)
    parser.add_argument("--synthetic", action="store_true")
    args = parser.parse_args()
    if args.synthetic:
        print("| synthetic world | pseudo-labels | on blameless steps | metric calls |\n|---|---|---|---|")
        for mode, steps in [("intermediate", 3), ("all", 3), ("all", 6)]:
            print(f"| {mode}, {steps} steps | " + " | ".join(map(str, synthetic(steps, mode))) + " |")
        return
    print("| outputs | pseudo-labels | on blameless predictors | metric calls |\n|---|---|---|---|")
    for reword in (False, True):
        runs = [attribute(reword, seed, args.follow) for seed in range(args.seeds)]
        labels = [label for run, _ in runs for label in run]
        blameless = sum(name not in kind(example) for name, example in labels)
        calls = sum(calls for _, calls in runs)
        print(f"| {'reworded' if reword else 'plain'} | {len(labels)} | {blameless} | {calls} |")


if __name__ == "__main__":
    main()
