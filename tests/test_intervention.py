"""Intervention options on the fake worlds: cumulative hints, hint delivery, label fields."""

from __future__ import annotations

import dspy
import pytest
from test_program_shapes import (
    Attempts,
    Tagger,
    convert,
    data,
    exact,
    lookup,
    nested_world,
    react_world,
    tagger_world,
)
from world import Pipeline, World, feedback_metric, make_data, world_lm

from dspy_agentgrad import AgentGrad, default_hint
from dspy_agentgrad.config import AgentGradConfig
from dspy_agentgrad.testing import fake_lm

FAST = dict(auto=None, max_rounds=2, progress=False)


def test_cumulative_hints_explain_more_failures_with_imperfect_hints_and_double_faults():
    dspy.configure(lm=world_lm(World(hint_follow_rate=0.8)))
    examples = make_data({"extract": 4, "notes": 4, "extract+notes": 4, "notes+answer": 3})
    single = AgentGrad(feedback_metric, config=AgentGradConfig.from_options(cumulative_hints=False, **FAST)).attribute(
        Pipeline(), examples
    )
    both = AgentGrad(feedback_metric, config=AgentGradConfig.from_options(**FAST)).attribute(Pipeline(), examples)
    assert single.explained_cumulative == 0 and both.explained_single == single.explained_single
    assert both.explained_cumulative > 0
    assert len(both.hard_cases) == len(single.hard_cases) - both.explained_cumulative
    # a double fault explained cumulatively yields a pseudo-label for each predictor at fault
    double = [r for r in both.attributed["notes"] if "kind=notes+answer" in r.example.question]
    answered = [r for r in both.attributed["answer"] if "kind=notes+answer" in r.example.question]
    assert {r.example.question for r in double} == {r.example.question for r in answered} != set()


@pytest.mark.parametrize("delivery", ["input_field", "instruction"])
def test_both_hint_deliveries_reach_threads_agents_and_refine_retries(delivery):
    options = dict(FAST, hint_delivery=delivery, cluster_schedule=(1,))
    dspy.configure(lm=fake_lm(tagger_world()))
    train = data(["a qb", "qd e", "f"], lambda v: "+".join(w.upper() for w in v.split()))
    assert (
        AgentGrad(exact("answer"), config=AgentGradConfig.from_options(**options))
        .attribute(Tagger(False), train)
        .counts()["tag"]
        == 2
    )
    dspy.configure(lm=fake_lm(react_world()))
    agent = dspy.ReAct("question -> answer", tools=[lookup, convert], max_iters=4)
    questions = [dspy.Example(question=q, answer=f"CODE-{q}".upper()).with_inputs("question") for q in ("hard1", "ok2")]
    assert (
        AgentGrad(exact("answer"), config=AgentGradConfig.from_options(**options))
        .attribute(agent, questions)
        .counts()["react"]
        == 1
    )
    world = nested_world(follows_hint=lambda call: "hint_" in call.inputs)
    world.answers["advice"] = lambda c: {"second.predict": "polish the draft properly"}
    dspy.configure(lm=fake_lm(world))
    train = data(["x1", "x2", "y3"], lambda v: v + "-d-p")
    assert AgentGrad(exact("answer"), config=AgentGradConfig.from_options(**options)).attribute(
        Attempts("refine"), train
    ).counts() == {
        "best.module.first": 0,
        "best.module.second.predict": 2,
    }


def test_label_fields_choose_what_the_default_hint_reveals():
    example = dspy.Example(q="x", answer="paris", type="bridge", level="hard").with_inputs("q")
    plain = default_hint(example, "p", dspy.Prediction(answer="rome"), "")
    assert plain.reveals == ("paris",) and "bridge" not in plain.text
    named = default_hint(example, "p", dspy.Prediction(answer="rome"), "", label_fields=("answer", "type"))
    assert named.reveals == ("paris", "bridge") and "type = bridge" in named.text
    told = default_hint(example, "p", None, "", output_fields={"p": ["search_query"]})
    assert "(search_query)" in told.text
