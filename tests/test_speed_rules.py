"""Exact early rejection, acceptance rules, what the prompt LM is shown, and the budget check before a rewrite."""

from __future__ import annotations

from fractions import Fraction

import dspy
import pytest
from world import Pipeline, World, dumps, feedback_metric, make_data, world_lm

from dspy_agentgrad import AgentGrad
from dspy_agentgrad.evaluation import cannot_clear

FAST = dict(retry_backoff_s=0, progress=False, auto=None)


class Recording(World):
    """The test world, keeping the inputs of every prompt-LM role call."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.role_inputs: list[tuple[list[str], dict]] = []

    def _role(self, call):
        self.role_inputs.append((call.output_fields, dict(call.inputs)))
        return super()._role(call)

    def inputs_of(self, output_field: str) -> list[dict]:
        return [inputs for fields, inputs in self.role_inputs if output_field in fields]


def compile_result(world: World, train, val, **options):
    dspy.configure(lm=world_lm(world))
    return AgentGrad(feedback_metric, **{**FAST, **options}).compile(Pipeline(), trainset=train, valset=val)


def decisions(result) -> list[tuple]:
    return [(c.round, c.predictor, c.instruction, c.accepted) for c in result.candidates]


def test_cannot_clear_is_exact_for_both_acceptance_rules():
    five = Fraction(5)
    assert cannot_clear(five, five, strict=True) and not cannot_clear(five, five, strict=False)
    assert cannot_clear(Fraction(4), five, strict=False) and not cannot_clear(Fraction(11, 2), five, strict=True)
    # exact arithmetic: 0.1 + 0.2 is not rounded past 0.3 the way float sums are
    assert not cannot_clear(Fraction(0.1) + Fraction(0.2), Fraction(0.1) + Fraction(0.2), strict=False)


def test_early_rejection_makes_the_decisions_of_full_evaluation_with_fewer_metric_calls():
    # The extract rewrite wins its cluster and then loses every validation example but its own kind.
    train = make_data({"extract": 3, "notes": 3})
    val = make_data({"none": 16, "extract": 2, "notes": 2}, start=50)
    runs = {
        chunk: compile_result(
            World(overfit=("extract",)), train, val, max_rounds=2, cluster_schedule=(1,), eval_chunk_size=chunk
        ).detailed_results
        for chunk in (2, 10_000)
    }
    early, full = runs[2], runs[10_000]
    assert decisions(early) == decisions(full)
    assert early.final_instructions == full.final_instructions
    assert early.best_val_score == full.best_val_score
    rejected = [c for c in early.candidates if c.predictor == "extract"]
    assert rejected and all(not c.accepted and "stopped after" in c.reason for c in rejected)
    assert early.metric_calls < full.metric_calls


@pytest.mark.parametrize("chunk", [1, 3])
def test_chunked_runs_are_identical_at_1_and_4_threads(chunk):
    train = make_data({"extract": 3, "notes": 2, "answer": 1, "none": 2})
    val = make_data({"none": 5, "extract": 2, "notes": 1}, start=50)
    results = []
    for threads in (1, 4):
        result = compile_result(
            World(overfit=("notes",)), train, val, max_rounds=3, num_threads=threads, eval_chunk_size=chunk
        ).detailed_results.to_dict()
        for key in ("wall_time_s", "options", "segments", "paid"):  # timings differ, decisions must not
            result.pop(key)
        results.append(dumps(result))
    assert results[0] == results[1]


def test_non_decreasing_acceptance_keeps_a_rewrite_that_ties_on_validation():
    # The notes fix repairs the training failures but no validation example needs it: a tie.
    train = make_data({"notes": 2})
    val = make_data({"none": 4}, start=50)
    strict = compile_result(World(), train, val, max_rounds=1, cluster_schedule=(1,)).detailed_results
    tie = compile_result(
        World(), train, val, max_rounds=1, cluster_schedule=(1,), val_acceptance="non_decreasing"
    ).detailed_results
    assert [c.accepted for c in strict.candidates] == [False]
    assert [c.accepted for c in tie.candidates] == [True]
    assert tie.candidates[0].reason == "gain on cluster, equal on validation"
    assert "FIX-notes" in tie.final_instructions["notes"] and "FIX-notes" not in strict.final_instructions["notes"]


def test_val_acceptance_must_be_known():
    with pytest.raises(ValueError, match="val_acceptance must be one of"):
        AgentGrad(feedback_metric, val_acceptance="sometimes", **FAST, max_rounds=1)


def test_prompt_roles_see_the_step_role_the_minimum_and_the_rejected_rewrites():
    world = Recording(overfit=("extract",))
    train = make_data({"extract": 2, "notes": 2})
    val = make_data({"none": 4, "extract": 1}, start=50)
    compile_result(world, train, val, max_rounds=3, cluster_schedule=(2, 1), max_instruction_chars=900)
    gradient = world.inputs_of("gradient")[0]
    assert gradient["program_steps"].splitlines()[0].startswith("1. extract:")
    assert "->" in gradient["step_signature"] or "keyword" in gradient["step_signature"]
    assert {inputs["min_cluster_size"] for inputs in world.inputs_of("clusters")} == {"2", "1"}
    rewrites = world.inputs_of("new_instruction")
    assert all(r["max_instruction_chars"] == "900" for r in rewrites)
    assert all("original output" in r["examples"] and "corrected output" in r["examples"] for r in rewrites)
    later_extract = [r for r in rewrites if "keyword" in r["current_instruction"]][1:]
    assert later_extract and all("OVERFIT" in r["rejected_rewrites"] for r in later_extract)


def test_no_rewrite_is_asked_for_when_the_budget_cannot_pay_its_checks():
    world = World()
    train = make_data({"notes": 2})
    val = make_data({"none": 8}, start=50)
    # 8 validation + 2 training runs + 2 interventions leave 3 calls: not enough for 2 cluster + 8 validation.
    result = compile_result(world, train, val, max_metric_calls=15, cluster_schedule=(1,)).detailed_results
    assert world.calls["rewrite"] == 0
    assert result.candidates == []
    assert "budget" in result.stop_reason
    assert result.metric_calls <= 15
