"""Each decision is the one the method calls for, and the result explains the program returned.

Small worlds (tests/world.py) where a speed mechanism (validating winners together, stacking them across rounds,
the starting validation pass beside round 0, speculation) or a stop half-way once made a decision the
one-at-a-time procedure would not, or lost a record of one it made.
"""

from __future__ import annotations

import math
import threading
import time

import dspy
import pytest
from reference_agentgrad import replayed
from world import Pipeline, World, feedback_metric, make_data, world_lm

from dspy_agentgrad import AgentGrad
from dspy_agentgrad.config import AgentGradConfig
from dspy_agentgrad.core.events import StopRun
from dspy_agentgrad.program.evaluation import Evaluator

FAST = dict(progress=False, auto=None)


def run(world: World, train, val, **options):
    dspy.configure(lm=world_lm(world))
    callbacks = options.pop("callbacks", None)
    return AgentGrad(
        feedback_metric, callbacks=callbacks, config=AgentGradConfig.from_options(**{**FAST, **options})
    ).compile(Pipeline(), trainset=train, valset=val)


def verdicts(result) -> list[tuple]:
    return [(c.round, c.predictor, c.instruction, c.accepted) for c in result.candidates]


class LearnsFromRejections(World):
    """The test world, but a rewrite of an overfitting predictor drops the overfit once a rewrite carrying it was
    rejected (the rewrite role is shown its predictor's rejected rewrites)."""

    def _role(self, call):
        out = super()._role(call)
        if "new_instruction" in call.output_fields and "OVERFIT" in call.inputs.get("rejected_rewrites", ""):
            out = {"new_instruction": out["new_instruction"].replace(" OVERFIT", "")}
        return out


# ---- a stacked winner is kept only on the program it won its cluster on ------------------------------------------


def test_a_winner_that_won_its_cluster_only_on_a_rejected_winner_is_judged_again_and_rejected():
    # extract's rewrite overfits: it fixes its cluster and breaks every other example. notes's rewrite fixes the
    # extract+notes examples only on top of it. The stack loses validation; on the starting program notes's
    # cluster stays at 0 (its validation gain, from the notes example, must not carry it in).
    train = make_data({"extract": 2, "extract+notes": 2})
    val = make_data({"none": 6, "extract": 1, "extract+notes": 1, "notes": 1}, start=50)
    options = dict(max_rounds=1, cluster_schedule=(1,), stack_rounds=1, reflect_hard_cases=False, cumulative_hints=True)
    alone = run(World(overfit=("extract",)), train, val, validate_together=False, **options).detailed_results
    together = run(World(overfit=("extract",)), train, val, validate_together=True, **options).detailed_results
    assert verdicts(together) == verdicts(alone)
    notes = next(c for c in together.candidates if c.predictor == "notes")
    assert not notes.accepted and (notes.cluster_score_before, notes.cluster_score_after) == (0.0, 0.0)
    assert together.final_instructions == alone.final_instructions == together.initial_instructions


# ---- the stop rule reads only validated programs ---------------------------------------------------------------


def test_no_failure_under_unvalidated_winners_does_not_stop_the_run():
    # Round 0's extract rewrite overfits: it fixes the whole training set (extract examples only) and loses
    # validation. With stack_rounds=2, round 1 measures failures on it, unvalidated: none. The run must go on
    # once the window's pass rejects it, as it does with stack_rounds=1, to the clean rewrite.
    train = make_data({"extract": 3})
    val = make_data({"none": 4, "extract": 2}, start=50)
    results = {
        rounds: run(
            LearnsFromRejections(overfit=("extract",)),
            train,
            val,
            max_rounds=5,
            cluster_schedule=(1,),
            stack_rounds=rounds,
        ).detailed_results
        for rounds in (1, 2)
    }
    assert results[1].best_val_score == 1.0
    assert results[2].best_val_score == 1.0
    assert results[2].final_instructions == results[1].final_instructions


# ---- the starting validation pass does not race round 0 for the budget ----------------------------------------


@pytest.fixture
def slow_background_validation(monkeypatch):
    """The starting validation pass, run beside round 0, starts late (as a busy machine may schedule it): it must
    get the calls it would have at one thread all the same."""
    evaluate = Evaluator.evaluate

    def late(self, instructions, examples, phase):
        if phase == "validate" and threading.current_thread() is not threading.main_thread():
            time.sleep(0.3)
        return evaluate(self, instructions, examples, phase)

    monkeypatch.setattr(Evaluator, "evaluate", late)


@pytest.mark.parametrize("cap", [12, 14, 20])
def test_the_starting_validation_pass_gets_its_budget_at_any_thread_count(cap, slow_background_validation):
    train = make_data({"extract": 4, "notes": 3, "none": 3})
    val = make_data({"none": 6, "notes": 2}, start=50)
    results = [
        run(World(), train, val, max_metric_calls=cap, cluster_schedule=(1,), num_threads=threads).detailed_results
        for threads in (1, 4)
    ]
    one, four = results
    assert not math.isnan(four.initial_val_score) and four.initial_val_score == one.initial_val_score
    assert four.metric_calls == one.metric_calls
    assert four.stop_reason.split(":")[0] == one.stop_reason.split(":")[0]  # what was set aside when may differ
    assert verdicts(four) == verdicts(one) and four.best_val_score == one.best_val_score


# ---- speculation spends no task-LM call the capped procedure needs, and none at one thread -------------------


@pytest.mark.parametrize("cap", [120, 180, 260])
def test_speculation_changes_no_decision_under_a_task_call_cap(cap):
    train = make_data({"extract": 3, "notes": 3, "answer": 2, "none": 4})
    val = make_data({"none": 6, "extract": 2, "notes": 2}, start=50)
    results = [
        run(World(), train, val, max_rounds=4, max_task_calls=cap, num_threads=4, speculate=flag).detailed_results
        for flag in (True, False)
    ]
    on, off = results
    assert verdicts(on) == verdicts(off) and on.metric_calls == off.metric_calls
    assert on.final_instructions == off.final_instructions and on.stop_reason == off.stop_reason


def test_speculation_costs_no_task_lm_call_at_one_thread():
    train = make_data({"extract": 3, "notes": 3, "answer": 2, "none": 4})
    val = make_data({"none": 6, "extract": 2, "notes": 2}, start=50)
    on, off = (run(World(), train, val, max_rounds=3, speculate=flag).detailed_results for flag in (True, False))
    assert verdicts(on) == verdicts(off)
    assert on.usage["task"]["calls"] == off.usage["task"]["calls"]


# ---- a judged candidate is never missing from the result -------------------------------------------------------


class Proposals:
    """Counts the candidates proposed (each must end in the result, with a verdict or the reason it has none)."""

    def __init__(self):
        self.count = 0

    def on_candidate_proposed(self, event):
        self.count += 1


def _stack_that_loses(proposals: Proposals, **options):
    # answer's and notes's rewrites win their clusters; extract's overfits; the stack loses validation and its
    # winners are validated alone, while the budget lasts
    train = make_data({"extract": 3, "notes": 2, "answer": 2})
    val = make_data({"none": 6, "notes": 1, "answer": 1}, start=50)
    options = dict(cluster_schedule=(1,), stack_rounds=1, reflect_hard_cases=False, callbacks=[proposals], **options)
    return run(World(overfit=("extract",)), train, val, **options).detailed_results


def test_the_solo_passes_after_a_lost_stack_keep_their_records_when_the_budget_ends():
    full = _stack_that_loses(Proposals(), max_rounds=1)
    assert len(full.candidates) == 3 and "budget" not in full.stop_reason
    stopped_in_solo_passes = 0
    for cap in range(full.metric_calls - 1, full.metric_calls - 12, -1):
        proposals = Proposals()
        result = _stack_that_loses(proposals, max_rounds=1, max_metric_calls=cap)
        assert result.metric_calls <= cap
        assert len(result.candidates) == proposals.count, cap  # every candidate proposed is recorded
        assert replayed(result) == result.final_instructions
        assert result.rounds and result.rounds[0].metric_calls == result.metric_calls
        stopped_in_solo_passes += proposals.count == 3 and "budget" in result.stop_reason
    assert stopped_in_solo_passes  # the world reaches the case


def test_a_stop_callback_at_the_first_verdict_keeps_the_rest_of_the_round():
    class StopAtFirst:
        def on_candidate_accepted(self, event):
            raise StopRun("enough")

        on_candidate_rejected = on_candidate_accepted

    train = make_data({"extract": 3, "notes": 2, "answer": 2})
    val = make_data({"none": 6, "notes": 1, "answer": 1, "extract": 1}, start=50)
    dspy.configure(lm=world_lm(World()))
    options = dict(max_rounds=2, cluster_schedule=(1,), stack_rounds=1, callbacks=[StopAtFirst()])
    callbacks = options.pop("callbacks")
    result = AgentGrad(
        feedback_metric, callbacks=callbacks, config=AgentGradConfig.from_options(**{**FAST, **options})
    ).compile(Pipeline(), trainset=train, valset=val)
    result = result.detailed_results
    assert result.stop_reason == "enough"
    assert len(result.candidates) == 3 and all(c.accepted for c in result.candidates)
    assert replayed(result) == result.final_instructions
    assert result.rounds[0].candidates == 3 and result.rounds[0].metric_calls == result.metric_calls


@pytest.mark.parametrize("cap", [None, 60, 52])
def test_a_lost_stack_decides_as_one_at_a_time_judging_where_rewrites_interact_and_budgets_bind(cap):
    # notes's rewrite wins its cluster only on top of extract's, which overfits; answer's wins on its own. Under
    # each cap, a verdict the stacked run reaches is the one one-at-a-time judging gives the same candidate.
    train = make_data({"extract": 2, "extract+notes": 2, "answer": 2})
    val = make_data({"none": 6, "extract": 1, "extract+notes": 1, "notes": 1, "answer": 1}, start=50)
    options = dict(max_rounds=2, cluster_schedule=(1,), stack_rounds=1, reflect_hard_cases=False, speculate=False)
    runs = [
        run(
            World(overfit=("extract",)), train, val, validate_together=flag, max_metric_calls=cap, **options
        ).detailed_results
        for flag in (True, False)
    ]
    reached = [
        {
            (r, p, i): accepted
            for (r, p, i, accepted), c in zip(verdicts(run), run.candidates)
            if "stopped" not in c.reason
        }
        for run in runs
    ]
    together, alone = reached
    assert all(alone[key] == verdict for key, verdict in together.items() if key in alone)
    assert together or cap == 52  # at 52 the budget ends inside the solo passes: every verdict there is unfinished
    assert all(replayed(r) == r.final_instructions for r in runs)
    if cap is None:
        assert together == alone and runs[0].final_instructions == runs[1].final_instructions
