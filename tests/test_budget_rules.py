"""Task-LM caps that hold whatever reuse saves, and candidates validated together."""

from __future__ import annotations

import dspy
import pytest
from world import Pipeline, World, feedback_metric, make_data, world_lm

from dspy_agentgrad import AgentGrad
from dspy_agentgrad.runtime.budget import Budget, TaskCapReached, TaskTicket

FAST = dict(retry_backoff_s=0, progress=False, auto=None)


def task_spend(lm: dspy.LM) -> tuple[int, int]:
    """Calls and tokens the task LM really answered (its history holds every call, dropped runs' too)."""
    tokens = sum((h.get("usage") or {}).get("total_tokens", 0) for h in lm.history)
    return len(lm.history), tokens


def capped_run(threads: int, **caps):
    world = World()
    task_lm, prompt_lm = world_lm(world), world_lm(world)
    dspy.configure(lm=task_lm)
    train = make_data({"extract": 3, "notes": 3, "answer": 2, "none": 2})
    val = make_data({"none": 4, "extract": 2, "notes": 2}, start=50)
    optimizer = AgentGrad(
        feedback_metric, task_model=task_lm, prompt_model=prompt_lm, max_rounds=6, num_threads=threads, **FAST, **caps
    )
    compiled = optimizer.compile(Pipeline(), trainset=train, valset=val)
    return compiled.detailed_results, task_spend(task_lm)


@pytest.mark.parametrize("threads", [1, 4])
def test_task_call_cap_holds_and_stops_the_run(threads):
    uncapped, (calls, _) = capped_run(threads)
    cap = calls // 2
    result, (capped_calls, _) = capped_run(threads, max_task_calls=cap)
    assert capped_calls <= cap
    assert "task-LM budget" in result.stop_reason
    assert result.metric_calls < uncapped.metric_calls
    assert result.best_val_score >= result.initial_val_score  # the best program so far is returned


@pytest.mark.parametrize("threads", [1, 4])
def test_task_token_cap_holds(threads):
    _, (_, tokens) = capped_run(threads)
    cap = tokens // 2
    result, (_, capped_tokens) = capped_run(threads, max_task_tokens=cap)
    assert 0 < capped_tokens <= cap
    assert "task-LM budget" in result.stop_reason


def test_a_task_call_waits_for_calls_in_flight_and_is_refused_only_when_nothing_can_free_room():
    budget = Budget(max_task_calls=3, max_task_tokens=100)
    first = budget.admit_task_call(TaskTicket(2, 40))
    with pytest.raises(TaskCapReached):  # 2 + 2 calls could pass 3 even once the first is settled at its worst
        budget.settle_task_call(first, 2, 40)
        budget.admit_task_call(TaskTicket(2, 10))
    one = budget.admit_task_call(TaskTicket(1, 60))  # 2 paid + 1 = 3 calls, 40 + 60 = 100 tokens: fits exactly
    budget.settle_task_call(one, 1, 5)
    assert (budget.task_calls, budget.task_tokens) == (3, 45)


def test_task_caps_must_be_positive_integers():
    with pytest.raises(ValueError, match="max_task_tokens"):
        AgentGrad(feedback_metric, max_task_tokens=0, **FAST, max_rounds=1)


def judged(validate_together: bool, overfit: tuple[str, ...] = ()):
    world = World(overfit=overfit)
    dspy.configure(lm=world_lm(world))
    train = make_data({"extract": 3, "notes": 3, "answer": 3})
    val = make_data({"none": 6, "extract": 2, "notes": 2, "answer": 2}, start=50)
    optimizer = AgentGrad(
        feedback_metric,
        max_rounds=1,
        cluster_schedule=(1,),
        speculate=False,
        reuse_calls=False,
        validate_together=validate_together,
        **FAST,
    )
    return optimizer.compile(Pipeline(), trainset=train, valset=val).detailed_results


def test_winners_validated_together_take_one_validation_pass():
    alone, together = judged(False), judged(True)
    assert [c.accepted for c in together.candidates] == [c.accepted for c in alone.candidates] == [True] * 3
    assert together.final_instructions == alone.final_instructions
    assert together.best_val_score == alone.best_val_score
    assert together.phase_calls["validate"] == alone.phase_calls["validate"] - 2 * 12  # three passes -> one


def test_a_stack_that_loses_on_validation_falls_back_to_each_winner_alone():
    # The extract rewrite wins its cluster but breaks validation: the stack with it loses, so each winner
    # is validated on its own and the decisions are those of one-at-a-time judging.
    alone, together = judged(False, overfit=("extract",)), judged(True, overfit=("extract",))
    assert [(c.predictor, c.accepted) for c in together.candidates] == [
        (c.predictor, c.accepted) for c in alone.candidates
    ]
    assert together.final_instructions == alone.final_instructions
    assert not all(c.accepted for c in together.candidates) and any(c.accepted for c in together.candidates)


def test_the_paper_preset_sets_the_papers_procedure_and_an_option_passed_wins():
    paper = AgentGrad(feedback_metric, preset="paper", max_rounds=1, **FAST).config
    assert (paper.reuse_calls, paper.speculate, paper.validate_together, paper.cumulative_hints) == (False,) * 4
    assert paper.cluster_schedule == (3, 2, 1)
    mixed = AgentGrad(feedback_metric, preset="paper", cumulative_hints=True, max_rounds=1, **FAST).config
    assert mixed.cumulative_hints and not mixed.validate_together
    default = AgentGrad(feedback_metric, max_rounds=1, **FAST).config
    assert default.reuse_calls and default.validate_together
    with pytest.raises(ValueError, match="preset must be one of"):
        AgentGrad(feedback_metric, preset="fast", max_rounds=1, **FAST)
