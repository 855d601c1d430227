"""Exact early rejection, acceptance rules, what the prompt LM is shown, and the budget check before a rewrite."""

from __future__ import annotations

from fractions import Fraction

import dspy
import pytest
from world import Pipeline, World, dumps, feedback_metric, make_data, world_lm

from dspy_agentgrad import AgentGrad
from dspy_agentgrad.config import AgentGradConfig
from dspy_agentgrad.core.judging import acceptance
from dspy_agentgrad.core.judging.acceptance import cannot_clear

FAST = dict(progress=False, auto=None)


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
    return AgentGrad(feedback_metric, config=AgentGradConfig.from_options(**{**FAST, **options})).compile(
        Pipeline(), trainset=train, valset=val
    )


def decisions(result) -> list[tuple]:
    return [(c.round, c.predictor, c.instruction, c.accepted) for c in result.candidates]


def test_cannot_clear_is_exact_for_both_acceptance_rules():
    five = Fraction(5)
    assert cannot_clear(five, five, strict=True) and not cannot_clear(five, five, strict=False)
    assert cannot_clear(Fraction(4), five, strict=False) and not cannot_clear(Fraction(11, 2), five, strict=True)
    # exact arithmetic: 0.1 + 0.2 is not rounded past 0.3 the way float sums are
    assert not cannot_clear(Fraction(0.1) + Fraction(0.2), Fraction(0.1) + Fraction(0.2), strict=False)


def test_early_rejection_makes_the_decisions_of_full_evaluation_with_fewer_metric_calls(monkeypatch):
    # The extract rewrite wins its cluster and then loses every validation example but its own kind.
    train = make_data({"extract": 3, "notes": 3})
    val = make_data({"none": 16, "extract": 2, "notes": 2}, start=50)
    runs = {}
    for chunk in (2, 10_000):
        monkeypatch.setattr(acceptance, "EVAL_CHUNK_SIZE", chunk)  # examples scored per step of a check
        runs[chunk] = compile_result(
            World(overfit=("extract",)),
            train,
            val,
            max_rounds=2,
            cluster_schedule=(1,),
            speculate=False,  # stacked checks score every validation example ahead
            reflect_hard_cases=False,  # the extract rewrite's hard cases would add candidates judged on clusters
        ).detailed_results
    early, full = runs[2], runs[10_000]
    assert decisions(early) == decisions(full)
    assert early.final_instructions == full.final_instructions
    assert early.best_val_score == full.best_val_score
    rejected = [c for c in early.candidates if c.predictor == "extract"]
    assert rejected and all(not c.accepted and "stopped after" in c.reason for c in rejected)
    assert early.metric_calls < full.metric_calls


@pytest.mark.parametrize("chunk", [1, 3])
def test_chunked_runs_are_identical_at_1_and_4_threads(chunk, monkeypatch):
    monkeypatch.setattr(acceptance, "EVAL_CHUNK_SIZE", chunk)  # examples scored per step of a check
    train = make_data({"extract": 3, "notes": 2, "answer": 1, "none": 2})
    val = make_data({"none": 5, "extract": 2, "notes": 1}, start=50)
    results = []
    for threads in (1, 4):
        result = compile_result(
            World(overfit=("notes",)), train, val, max_rounds=3, num_threads=threads
        ).detailed_results.to_dict()
        # timings differ, and LM usage (runs made ahead at 4 threads only), decisions must not
        for key in ("wall_time_s", "phase_wall_s", "options", "segments", "paid", "usage"):
            result.pop(key)
        results.append(dumps(result))
    assert results[0] == results[1]


def test_by_default_a_rewrite_that_ties_on_validation_is_kept_and_strict_acceptance_drops_it():
    # The notes fix repairs the training failures but no validation example needs it: a tie.
    train = make_data({"notes": 2})
    val = make_data({"none": 4}, start=50)
    options = dict(max_rounds=1, cluster_schedule=(1,))
    strict = compile_result(World(), train, val, val_acceptance="strict", **options).detailed_results
    tie = compile_result(World(), train, val, **options).detailed_results
    assert [c.accepted for c in strict.candidates] == [False]
    assert [c.accepted for c in tie.candidates] == [True]
    assert tie.candidates[0].reason == "gain on cluster, equal on validation"
    assert "FIX-notes" in tie.final_instructions["notes"] and "FIX-notes" not in strict.final_instructions["notes"]


@pytest.mark.parametrize("needing_the_fix, kept", [(1, False), (2, True)])
def test_robust_acceptance_keeps_no_gain_that_one_validation_example_decides(needing_the_fix, kept):
    # The notes fix repairs every validation example that needs it: with one such example, that example alone
    # carries the gain, and "robust" refuses what "strict" keeps; with two, both keep it.
    train = make_data({"notes": 2})
    val = make_data({"notes": needing_the_fix, "none": 4 - needing_the_fix}, start=50)
    options = dict(max_rounds=1, cluster_schedule=(1,))
    strict = compile_result(World(), train, val, val_acceptance="strict", **options).detailed_results
    robust = compile_result(World(), train, val, val_acceptance="robust", **options).detailed_results
    assert [c.accepted for c in strict.candidates] == [True]
    assert [c.accepted for c in robust.candidates] == [kept]
    assert robust.metric_calls == strict.metric_calls  # the rule reads the scores the strict pass paid for
    if not kept:
        assert robust.candidates[0].reason == "its gain on validation rests on one example"
        assert robust.best_val_score == robust.initial_val_score < strict.best_val_score


def test_val_acceptance_must_be_known():
    with pytest.raises(ValueError, match="val_acceptance must be one of"):
        AgentGrad(
            feedback_metric, val_acceptance="sometimes", config=AgentGradConfig.from_options(**FAST, max_rounds=1)
        )


def test_prompt_roles_see_the_step_role_the_minimum_and_the_rejected_rewrites():
    world = Recording(overfit=("extract",))
    train = make_data({"extract": 2, "notes": 2})
    val = make_data({"none": 4, "extract": 1}, start=50)
    # each round validates its own winners (stack_rounds=1): the overfitting extract rewrite is rejected in round 0,
    # so round 1 (minimum 1) attributes its failures on a validated program
    compile_result(world, train, val, max_rounds=3, cluster_schedule=(2, 1), max_instruction_chars=900, stack_rounds=1)
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


# ---- reuse of unchanged runs ----------------------------------------------------------------------


class Chatty(World):
    """The test world, but each live notes or answer call adds a fresh call number to its output:
    the same prompt never gives the same text twice (as a sampling LM without a cache)."""

    def __call__(self, call):
        out = super().__call__(call)
        field = next((f for f in ("notes", "answer") if isinstance(out, dict) and f in out), None)
        if field is not None:
            out = {field: f"{out[field]} (call {sum(self.calls.values())})"}
        return out


def first_word_metric(gold, pred, trace=None, pred_name=None, pred_trace=None):
    ok = str(getattr(pred, "answer", "")).split(" ")[0] == gold.answer
    return dspy.Prediction(score=float(ok), feedback="correct" if ok else f"expected {gold.answer}")


def counted_compile(world: World, train, val, score=feedback_metric, **options):
    """The result and how many times the metric was really called."""
    calls = []

    def metric(gold, pred, trace=None, pred_name=None, pred_trace=None):
        calls.append(1)
        return score(gold, pred, trace)

    dspy.configure(lm=world_lm(world))
    compiled = AgentGrad(metric, config=AgentGradConfig.from_options(**{**FAST, **options})).compile(
        Pipeline(), trainset=train, valset=val
    )
    return compiled.detailed_results, len(calls)


@pytest.mark.parametrize("threads", [1, 4])
def test_reuse_makes_the_decisions_of_full_runs_with_fewer_metric_calls(threads):
    train = make_data({"extract": 3, "notes": 3, "answer": 2, "extract+notes": 2, "none": 2})
    val = make_data({"none": 8, "extract": 2, "notes": 2, "answer": 2}, start=50)
    options = dict(max_rounds=3, cluster_schedule=(2, 1), num_threads=threads)
    (full, full_calls), (reused, reused_calls) = (
        counted_compile(World(overfit=("answer",)), train, val, reuse_calls=flag, **options) for flag in (False, True)
    )
    assert decisions(reused) == decisions(full) and reused.final_instructions == full.final_instructions
    assert [c.val_score for c in reused.candidates] == [c.val_score for c in full.candidates]
    assert [s for _, s in reused.val_history] == [s for _, s in full.val_history]
    assert any(c.accepted for c in full.candidates) and any(not c.accepted for c in full.candidates)
    # what is reported is what the metric saw; the runs not scored took an identical output's score
    assert (full_calls, reused_calls) == (full.metric_calls, reused.metric_calls)
    assert full.reused_runs == 0 and reused.reused_runs > 0
    # without reuse every run makes all its calls: its task spend is its metric calls; with reuse it is less
    assert full.task_spend == full.metric_calls and 0 < reused.task_spend < full.task_spend
    assert reused.metric_calls < 0.8 * full.metric_calls
    assert reused.usage["task"]["calls"] < full.usage["task"]["calls"]  # unchanged calls are replayed, not paid


def test_runs_whose_output_changes_are_scored_and_decide_as_full_runs_do():
    train = make_data({"extract": 2, "notes": 3, "answer": 2, "none": 2})
    val = make_data({"none": 4, "notes": 2, "answer": 2}, start=50)
    options = dict(max_rounds=2, cluster_schedule=(1,), score=first_word_metric)
    (full, _), (chatty, chatty_calls), (steady, _) = (
        counted_compile(world, train, val, reuse_calls=flag, **options)
        for world, flag in ((Chatty(), False), (Chatty(), True), (World(), True))
    )
    assert decisions(chatty) == decisions(full) and chatty.best_val_score == full.best_val_score
    assert any(c.accepted for c in chatty.candidates)
    # a live notes or answer call never repeats its text, so only runs where both were replayed (the
    # change left their inputs as they were) can take an earlier score: fewer than in the steady world
    assert chatty_calls == chatty.metric_calls
    assert chatty.reused_runs < steady.reused_runs
    assert chatty.metric_calls > steady.metric_calls
