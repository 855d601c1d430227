"""A world whose LM rewords every output with its prompt: how many pseudo-labels land on blameless predictors.

The 3-predictor world of tests/world.py, except that every task output carries a tag derived from the
whole prompt (instruction, inputs, hint), the way an API model words its answer differently whenever
its prompt changes, and that whether a hinted faulty predictor follows its hint depends on the wording
of its inputs. A hint on a blameless upstream predictor then changes nothing that matters, yet it
rewords that predictor's output and so can make a downstream predictor follow its own hint. Run:

    PYTHONPATH=$PWD python tests/rewording_sim.py [--seeds 6] [--follow 0.7]

It prints, for outputs plain and reworded, the pseudo-labels of one attribution per seed, how many
went to a predictor the example's kind does not name (blameless), and the metric calls.
"""

from __future__ import annotations

import argparse
import re
import sys
import zlib
from pathlib import Path

import dspy

sys.path.insert(0, str(Path(__file__).parent))
from world import Pipeline, World, feedback_metric, make_data, retrieve, world_lm  # noqa: E402

from dspy_agentgrad import AgentGrad  # noqa: E402
from dspy_agentgrad.program.tracing import HINT_FIELD  # noqa: E402
from dspy_agentgrad.testing import FakeCall  # noqa: E402

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


def attribute(reword: bool, seed: int, follow: float = 0.7):
    """One attribution of a batch in the world: (predictor, example) per pseudo-label, and the metric calls."""
    dspy.configure(lm=world_lm(RewordingWorld(reword, hint_follow_rate=follow)))
    calls = []

    def metric(gold, pred, trace=None, pred_name=None, pred_trace=None):
        calls.append(1)
        return feedback_metric(gold, pred, trace, pred_name, pred_trace)

    optimizer = AgentGrad(metric, auto=None, max_rounds=1, seed=seed, retry_backoff_s=0, progress=False)
    report = optimizer.attribute(WordingPipeline(), make_data(TRAIN, start=seed * 100))
    labels = [(name, r.example) for name, records in report.attributed.items() for r in records]
    return labels, len(calls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=6)
    parser.add_argument("--follow", type=float, default=0.7)
    args = parser.parse_args()
    print("| outputs | pseudo-labels | on blameless predictors | metric calls |\n|---|---|---|---|")
    for reword in (False, True):
        runs = [attribute(reword, seed, args.follow) for seed in range(args.seeds)]
        labels = [label for run, _ in runs for label in run]
        blameless = sum(name not in kind(example) for name, example in labels)
        calls = sum(calls for _, calls in runs)
        print(f"| {'reworded' if reword else 'plain'} | {len(labels)} | {blameless} | {calls} |")


if __name__ == "__main__":
    main()
