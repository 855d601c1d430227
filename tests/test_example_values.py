"""Examples holding an object whose text is a memory address: fine within one run, refused where a run is kept."""

from __future__ import annotations

import dspy
import pytest
from world import Pipeline, World, feedback_metric, make_data, world_lm

from dspy_agentgrad import AgentGrad
from dspy_agentgrad.config import AgentGradConfig
from dspy_agentgrad.runtime.jsonable import UnstableValue

FAST = dict(auto=None, progress=False, max_rounds=2, cluster_schedule=(1,))


class Source:
    """A plain object: its repr is ``<...Source object at 0x...>``."""


def with_sources(examples: list[dspy.Example]) -> list[dspy.Example]:
    return [dspy.Example(**ex.toDict(), source=Source()).with_inputs("question") for ex in examples]


TRAIN = with_sources(make_data({"extract": 2, "none": 1}))
VAL = with_sources(make_data({"extract": 1, "none": 1}, start=50))


def test_examples_holding_an_object_with_an_address_repr_are_optimized_without_a_log_dir():
    dspy.configure(lm=world_lm(World()))
    result = (
        AgentGrad(feedback_metric, config=AgentGradConfig.from_options(**FAST))
        .compile(Pipeline(), trainset=TRAIN, valset=VAL)
        .detailed_results
    )
    assert result.initial_val_score == 0.5 and result.best_val_score == 1.0
    report = AgentGrad(feedback_metric, config=AgentGradConfig.from_options(**FAST)).attribute(Pipeline(), TRAIN)
    assert report.counts()["extract"] == 2


def test_the_same_examples_are_refused_where_the_run_is_kept_for_a_resume(tmp_path):
    dspy.configure(lm=world_lm(World()))
    with pytest.raises(UnstableValue, match=r"trainset\[0\] field 'source' holds a Source object .*log_dir"):
        AgentGrad(feedback_metric, log_dir=tmp_path, config=AgentGradConfig.from_options(**FAST)).compile(
            Pipeline(), trainset=TRAIN, valset=VAL
        )
