"""The metric protocol: metrics written as dspy.Module, any finite score up to max_score, float rounding, and
errors that say how the metric was called and on which example."""

from __future__ import annotations

import math
import re

import dspy
import pytest
from world import Pipeline, RoleWorld, World, make_data, metric, world_lm

from dspy_agentgrad import AgentGrad, FirstRunsFailed, MetricError
from dspy_agentgrad.config import AgentGradConfig
from dspy_agentgrad.testing import FakeCall, fake_lm

FAST = dict(auto=None, progress=False)
TRAIN = make_data({"extract": 2, "notes": 1, "answer": 1})
VAL = make_data({"extract": 1, "none": 1}, start=50)


def compile_once(metric_fn, program=None, train=TRAIN, val=VAL, **options):
    options = {"max_rounds": 2, "cluster_schedule": (1,), **FAST, **options}
    return (
        AgentGrad(metric_fn, config=AgentGradConfig.from_options(**options))
        .compile(program or Pipeline(), trainset=train, valset=val)
        .detailed_results
    )


# ---- a metric written as a dspy.Module --------------------------------------------------------------


class Responder(dspy.Module):
    def __init__(self):
        super().__init__()
        self.respond = dspy.Predict("question -> response")

    def forward(self, question):
        return self.respond(question=question)


class JudgedWorld(RoleWorld):
    """The responder answers ``<question> done``, wrongly on questions starting with ``q`` unless hinted or taught;
    the LM judge of ``dspy.evaluate.SemanticF1`` gives full recall and precision to a response equal to the truth."""

    def __call__(self, call: FakeCall):
        if "current_instruction" in call.inputs:
            return self._role(call)
        if "system_response" in call.inputs:
            same = float(call.inputs["system_response"] == call.inputs["ground_truth"])
            return {"reasoning": "compared", "recall": same, "precision": same}
        question = call.inputs["question"]
        repaired = call.hint is not None or "FIX-response" in call.instructions
        return {"response": "wrong" if question.startswith("q") and not repaired else f"{question} done"}


def responses(questions: list[str]) -> list[dspy.Example]:
    return [dspy.Example(question=q, response=f"{q} done").with_inputs("question") for q in questions]


def test_dspy_semantic_f1_a_metric_written_as_a_module_is_called_through_its_forward():
    dspy.configure(lm=fake_lm(JudgedWorld()))
    train, val = responses(["qa", "qb", "c"]), responses(["qd", "e"])
    result = compile_once(dspy.evaluate.SemanticF1(), Responder(), train, val)
    assert result.initial_val_score == 0.5 and result.best_val_score == 1.0
    assert "FIX-response" in result.final_instructions["respond"]


class StrictJudge(dspy.Module):
    """A Module metric that takes no pred_name or pred_trace, and raises on every run."""

    def forward(self, example, pred, trace=None):
        raise KeyError("no rubric for this task")


def test_a_metric_that_raises_is_reported_as_it_was_actually_called():
    dspy.configure(lm=world_lm(World()))
    called = re.escape("called as StrictJudge.forward(example, prediction, trace=None)")
    with pytest.raises(FirstRunsFailed, match=called):
        compile_once(StrictJudge())


# ---- any finite score up to max_score ---------------------------------------------------------------


def minutes_off(gold, pred, trace=None):
    """DSPy's GEPA test metric, in this world: minus the minutes a wrong answer costs; 0 is perfect."""
    return 0.0 if getattr(pred, "answer", None) == gold.answer else -30.0


def test_a_metric_whose_perfect_score_is_zero_and_others_negative_is_optimized():
    dspy.configure(lm=world_lm(World()))
    result = compile_once(minutes_off, max_score=0, failure_score=-60)
    assert result.initial_val_score == -15.0 and result.best_val_score == 0.0
    unit = compile_once(metric)
    assert result.final_instructions == unit.final_instructions


def test_max_score_zero_without_a_failure_score_below_it_is_refused_with_the_fix():
    with pytest.raises(ValueError, match=r"failure_score=0.0 must be below max_score=0.*pass failure_score="):
        AgentGrad(minutes_off, config=AgentGradConfig.from_options(max_score=0, max_rounds=1, **FAST))


def test_negative_scores_below_a_positive_max_score_are_scores():
    dspy.configure(lm=world_lm(World()))
    result = compile_once(lambda gold, pred, trace=None: 1.0 if metric(gold, pred) else -1.0)
    assert result.initial_val_score == 0.0 and result.best_val_score == 1.0


def rubric(gold, pred, trace=None):
    """Four criteria weighted 0.2, 0.4, 0.3 and 0.1: their float sum is 1.0000000000000002."""
    ok = getattr(pred, "answer", None) == gold.answer
    return sum(w for w in (0.2, 0.4, 0.3, 0.1)) if ok else 0.2


def test_a_rubric_whose_float_sum_overshoots_max_score_by_rounding_counts_as_perfect():
    assert rubric(VAL[1], dspy.Prediction(answer=VAL[1].answer)) > 1.0
    dspy.configure(lm=world_lm(World()))
    result = compile_once(rubric)
    assert result.best_val_score == 1.0


@pytest.mark.parametrize("score", [1.5, 1.0000001])
def test_a_score_above_max_score_is_refused_showing_its_exact_value(score):
    dspy.configure(lm=world_lm(World()))
    with pytest.raises(MetricError, match=rf"scored {re.escape(repr(score))} on the example .*above max_score=1"):
        compile_once(lambda gold, pred, trace=None: score)


# ---- a result that is no score names the example ----------------------------------------------------


@pytest.mark.parametrize("bad", [None, "0.5", math.inf, math.nan])
def test_a_metric_returning_no_score_on_one_example_names_that_example(bad):
    def flawed(gold, pred, trace=None):
        return bad if gold.question.startswith("id51 ") else metric(gold, pred)

    dspy.configure(lm=world_lm(World()))
    with pytest.raises(MetricError, match=r"it returned .* on the example \(key [0-9a-f]+\) with inputs .*id51 kind="):
        compile_once(flawed)


def test_the_error_says_how_the_metric_was_called():
    def flawed(gold, pred, trace=None, pred_name=None, pred_trace=None):
        return None

    dspy.configure(lm=world_lm(World()))
    called = re.escape("called as flawed(example, prediction, trace=None, pred_name=None, pred_trace=None)")
    with pytest.raises(MetricError, match=called):
        compile_once(flawed)
