"""Worlds of the zoo: one seeded draw of every realism knob, and the data and simulated LMs it makes.

A world is a :class:`WorldSpec` (a dataclass that the zoo's results record in full, so that any world can be
built again from its line). :func:`draw_world` draws one from :data:`DISTRIBUTIONS`, the stated distribution of
each knob; :func:`build` turns it into the synthetic benchmark's data (with the defects it hides from the
validation set) and :func:`world_lms` into the task and prompt LMs (fresh ones per optimizer run, so call counts
and random draws are that run's own).
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass

import dspy

from benchmarks.registry import Benchmark
from benchmarks.synthetic import LookupChain, defect_frequencies, hint, make_examples, metric
from benchmarks.synthetic.realism import KNOBS, Realism
from benchmarks.synthetic.world import REWORD_MODES, SyntheticWorld
from dspy_agentgrad.testing import fake_lm

#: Each knob's distribution, in words (recorded in every results file) and as the draw below makes it.
DISTRIBUTIONS = {
    "steps": "uniform on {2, 3, 4, 5}",
    "reword": "repeat 30%, intermediate 35%, all 35%",
    "temperature": "0 with 40%, else uniform on [0.3, 1.0]",
    "hint_rate": "uniform on [0.5, 0.95]",
    "recall": "1 with 40%, else uniform on [0.5, 0.95]",
    "wrong_rule": "0 with 50%, else uniform on [0.05, 0.25]",
    "overreach": "0 with 50%, else uniform on [0.1, 0.5]",
    "interact": "0 with 50%, else uniform on [0.2, 0.6]",
    "fade": "0 with 50%, else uniform on [0.1, 0.6]",
    "unseen": "0 with 50%, else 1 or 2 defects (not the most frequent) absent from the validation set",
    "paraphrase": "0 with 50%, else uniform on [0.5, 1.0] (drawn on a stream of its own)",
}


@dataclass(frozen=True)
class WorldSpec:
    """Everything that makes one world; ``index`` and ``zoo_seed`` say where it was drawn."""

    index: int
    zoo_seed: int
    steps: int
    reword: str
    temperature: float
    hint_rate: float
    recall: float
    wrong_rule: float
    overreach: float
    interact: float
    fade: float
    unseen: tuple[int, ...]  # defect bits no validation example carries
    paraphrase: float = 0.0

    @property
    def data_seed(self) -> int:
        return self.zoo_seed * 1000 + self.index

    @property
    def noisy(self) -> bool:
        """The task LM samples or the prompt LM forgets: the worlds with a speed target of their own."""
        return self.temperature > 0 or self.recall < 1

    def realism(self, run_seed: int = 0) -> Realism:
        return Realism(**{name: getattr(self, name) for name in KNOBS}, seed=run_seed)

    def as_dict(self) -> dict:
        return asdict(self)

    def label(self) -> str:
        """A short description for tables: the knobs that are on."""
        parts = [f"{self.steps} steps", self.reword]
        parts += [f"T={self.temperature:.2f}"] if self.temperature else []
        parts += [f"recall {self.recall:.2f}"] if self.recall < 1 else []
        for name in ("wrong_rule", "overreach", "interact", "fade"):
            parts += [f"{name} {getattr(self, name):.2f}"] if getattr(self, name) else []
        parts += [f"unseen {len(self.unseen)}"] if self.unseen else []
        parts += [f"paraphrase {self.paraphrase:.2f}"] if self.paraphrase else []
        return ", ".join(parts)


def _sometimes(rng: random.Random, off_share: float, low: float, high: float, off: float = 0.0) -> float:
    return off if rng.random() < off_share else round(rng.uniform(low, high), 3)


def draw_world(index: int, zoo_seed: int) -> WorldSpec:
    """World ``index`` of the zoo drawn with ``zoo_seed`` (the same pair always gives the same world)."""
    rng = random.Random(f"zoo-{zoo_seed}-{index}")
    steps = rng.choice((2, 3, 4, 5))
    reword = rng.choices(REWORD_MODES, weights=(30, 35, 35))[0]
    temperature = _sometimes(rng, 0.4, 0.3, 1.0)
    hint_rate = round(rng.uniform(0.5, 0.95), 3)
    recall = _sometimes(rng, 0.4, 0.5, 0.95, off=1.0)
    wrong_rule = _sometimes(rng, 0.5, 0.05, 0.25)
    overreach = _sometimes(rng, 0.5, 0.1, 0.5)
    interact = _sometimes(rng, 0.5, 0.2, 0.6)
    fade = _sometimes(rng, 0.5, 0.1, 0.6)
    unseen: tuple[int, ...] = ()
    if rng.random() >= 0.5:
        ranked = sorted(defect_frequencies(steps, zoo_seed * 1000 + index).items(), key=lambda kv: -kv[1])
        unseen = tuple(sorted(rng.sample([bit for bit, _ in ranked[1:]], rng.choice((1, 2)))))
    # its own stream: the knobs above are those of zoos drawn before the prompt LM could reword
    paraphrase = _sometimes(random.Random(f"zoo-{zoo_seed}-{index}-paraphrase"), 0.5, 0.5, 1.0)
    return WorldSpec(
        index,
        zoo_seed,
        steps,
        reword,
        temperature,
        hint_rate,
        recall,
        wrong_rule,
        overreach,
        interact,
        fade,
        unseen,
        paraphrase,
    )


def build(spec: WorldSpec, train: int = 50, val: int = 50, test: int = 100) -> Benchmark:
    """The world's data and program: the synthetic benchmark's cases, with the unseen defects left out of the
    validation set only (training and test cases still carry them)."""
    seed, steps = spec.data_seed, spec.steps
    info = {"source": "benchmarks.zoo world", "world": spec.as_dict()}
    return Benchmark(
        "zoo",
        make_examples(train, steps, seed),
        make_examples(val, steps, seed, first_case=train, absent=frozenset(spec.unseen)),
        make_examples(test, steps, seed, first_case=train + val),
        lambda: LookupChain(steps, chain_of_thought=spec.reword == "all"),
        metric,
        hint,
        info,
    )


def world_lms(spec: WorldSpec, run_seed: int, task_s: float, prompt_s: float) -> tuple[dspy.LM, dspy.LM]:
    """A task LM and a prompt LM on one fresh simulated world (``run_seed`` seeds its random draws)."""
    world = SyntheticWorld(task_s, prompt_s, spec.reword, spec.overreach, spec.hint_rate, spec.realism(run_seed))
    return fake_lm(world, name="fake/zoo-task"), fake_lm(world, name="fake/zoo-prompt")
