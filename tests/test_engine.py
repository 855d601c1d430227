"""The round engine with a stubbed judge and stubbed sources: it asks the sources, hands each round's clusters to
whatever judge it holds, records the verdicts that judge gave, stops by its rules and settles the judge on the way
out."""

from __future__ import annotations

import dspy
from world import Pipeline, World, feedback_metric, make_data, world_lm

from dspy_agentgrad import AgentGrad, AgentGradConfig
from dspy_agentgrad.core.state import CandidateRecord, Cluster, RoundRecord
from dspy_agentgrad.runtime.budget import Budget


class StubSources:
    """No reflections; records the batch size of each round that asked for them."""

    def __init__(self):
        self.asked: list[int] = []

    def reflect(self, batch, attribution) -> list:
        self.asked.append(len(batch))
        return []


class StubJudge:
    """Rejects every cluster's candidate without a check, through the engine's verdict writer."""

    def __init__(self, verdicts):
        self.verdicts = verdicts
        self.rounds: list[tuple[int, int]] = []
        self.settled: list[bool] = []
        self.asked_for_plans = 0

    def validates_this_round(self) -> bool:
        self.asked_for_plans += 1
        return True

    def judge_round(
        self, ready: list[Cluster], minimum: int, round_record: RoundRecord, judged: list[CandidateRecord]
    ) -> None:
        self.rounds.append((round_record.round, len(ready)))
        for cluster in ready:
            record = CandidateRecord(round_record.round, cluster.predictor, len(cluster.members), minimum, "", "", None)
            self.verdicts.reject(record, "stubbed")
            judged.append(record)

    def waiting(self) -> list[CandidateRecord]:
        return []

    def settle(self, validate: bool, stopped: bool = False) -> None:
        self.settled.append(validate)


def stubbed_engine(train: list[dspy.Example], val: list[dspy.Example]):
    """An engine over the test world whose sources and judge are the stubs."""
    dspy.configure(lm=world_lm(World()))
    optimizer = AgentGrad(feedback_metric, seed=0, num_threads=1, config=AgentGradConfig.from_options(progress=False))
    engine = optimizer._engine(optimizer._parts(Pipeline(), Budget(), None), train, val)
    engine.sources, engine.judge = StubSources(), StubJudge(engine.verdicts)
    return engine, engine.sources, engine.judge


def test_the_engine_hands_each_round_to_its_judge_and_records_its_verdicts():
    train = make_data({"extract": 3, "notes": 2, "answer": 2, "none": 3})
    val = make_data({"extract": 2, "notes": 2, "none": 2}, start=50)
    engine, _, judge = stubbed_engine(train, val)
    starting = engine.state.instructions

    engine.run(max_rounds=2)

    rounds = engine.state.rounds
    assert [r for r, _ in judge.rounds] == [r.round for r in rounds] and rounds
    assert judge.asked_for_plans == len(rounds)  # the speculation layer reads each round's plan before judging
    assert [n for _, n in judge.rounds] == [r.clusters for r in rounds]
    assert any(n for _, n in judge.rounds), "the world's failures make clusters"
    assert [r.candidates for r in rounds] == [n for _, n in judge.rounds]
    assert len(engine.state.candidates) == sum(n for _, n in judge.rounds)
    assert all(not c.accepted and c.reason == "stubbed" for c in engine.state.candidates)
    assert engine.state.instructions == starting  # nothing was installed
    assert judge.settled == [True, False]  # after the last round, then on the way out


def test_the_engine_asks_its_sources_and_stops_once_a_batch_of_the_whole_training_set_passes():
    train, val = make_data({"none": 3}), make_data({"none": 2}, start=50)
    engine, sources, judge = stubbed_engine(train, val)

    reason = engine.run(max_rounds=5)

    assert reason == "no failures left on the training set"
    assert judge.rounds == [(0, 0)]  # one round, with no cluster to judge
    assert sources.asked == [len(train)]  # no failure gave a gradient: the sources' reflections were asked
    assert judge.settled == [True, False]
