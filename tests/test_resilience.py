"""Long runs that survive: kill and resume, LM faults, interruption, budget caps, mismatched resumes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import dspy
import pytest
from world import Pipeline, World, feedback_metric, make_data, world_lm

from dspy_agentgrad import AgentGrad, RunMismatch
from dspy_agentgrad.config import AgentGradConfig
from dspy_agentgrad.core.state import example_label
from dspy_agentgrad.testing import FaultyEngine, fake_lm

JOB = Path(__file__).parent / "resume_job.py"
FAST = dict(auto=None, progress=False)


def run_job(log_dir: Path, out: Path, ledger: Path, **env) -> int:
    environment = {**os.environ, "LEDGER": str(ledger), **env}
    return subprocess.run([sys.executable, str(JOB), str(log_dir), str(out)], env=environment, timeout=300).returncode


def decisions(result: dict) -> dict:
    keep = ("candidates", "rounds", "final_instructions", "best_val_score", "metric_calls", "val_history")
    return {k: result[k] for k in keep}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    base = tmp_path_factory.mktemp("uninterrupted")
    assert run_job(base / "log", base / "out.json", base / "ledger") == 0
    result = json.loads((base / "out.json").read_text())
    assert result["candidates"] and result["best_val_score"] > result["initial_val_score"]
    return result, len((base / "ledger").read_text().splitlines())


@pytest.mark.parametrize("kill_at", ["metric:5", "metric:30", "gradient:1", "rewrite:2", "abstract:2"])
def test_killed_run_resumes_to_the_same_result_without_paying_twice(tmp_path, uninterrupted, kill_at):
    expected, expected_calls = uninterrupted
    log, out, ledger = tmp_path / "log", tmp_path / "out.json", tmp_path / "ledger"
    assert run_job(log, out, ledger, KILL_AT=kill_at) == -9  # SIGKILL
    assert not out.exists()
    json.loads((log / "run.json").read_text())  # atomic writes: whole files after a kill
    if (log / "state.json").exists():
        json.loads((log / "state.json").read_text())
    assert run_job(log, out, ledger) == 0
    resumed = json.loads(out.read_text())
    assert resumed["resumed"] is True
    assert decisions(resumed) == decisions(expected)
    # the metric call running when the kill came is the only one paid twice
    paid_calls = len(ledger.read_text().splitlines())
    assert paid_calls <= expected_calls + 1
    # the result accounts for both segments: the killed one too
    assert resumed["paid"]["segments"] == len(resumed["segments"]) == 2
    assert paid_calls - 1 <= resumed["paid"]["metric_calls"] <= paid_calls  # all but a call lost in flight
    assert resumed["segments"][0]["metric_calls"] > 0 and resumed["segments"][0]["finished"] is False
    assert resumed["wall_time_s"] == pytest.approx(sum(s["wall_time_s"] for s in resumed["segments"]))


def test_resume_with_threads_reaches_the_same_result(tmp_path, uninterrupted):
    expected, _ = uninterrupted
    log, out, ledger = tmp_path / "log", tmp_path / "out.json", tmp_path / "ledger"
    assert run_job(log, out, ledger, KILL_AT="metric:30", THREADS="3") == -9
    assert run_job(log, out, ledger, THREADS="3") == 0
    assert decisions(json.loads(out.read_text())) == decisions(expected)


def test_resume_with_other_data_or_options_is_refused(tmp_path):
    dspy.configure(lm=world_lm(World()))
    train, val = make_data({"extract": 2}), make_data({"extract": 1, "none": 1}, start=50)
    AgentGrad(feedback_metric, log_dir=tmp_path, config=AgentGradConfig.from_options(max_rounds=1, **FAST)).compile(
        Pipeline(), trainset=train, valset=val
    )
    with pytest.raises(RunMismatch, match="trainset"):
        AgentGrad(feedback_metric, log_dir=tmp_path, config=AgentGradConfig.from_options(max_rounds=1, **FAST)).compile(
            Pipeline(), trainset=make_data({"notes": 2}), valset=val
        )
    with pytest.raises(RunMismatch, match="options"):
        AgentGrad(
            feedback_metric, seed=7, log_dir=tmp_path, config=AgentGradConfig.from_options(max_rounds=1, **FAST)
        ).compile(Pipeline(), trainset=train, valset=val)


def test_torn_memo_line_is_dropped_on_resume(tmp_path):
    dspy.configure(lm=world_lm(World()))
    train, val = make_data({"extract": 2, "notes": 2}), make_data({"extract": 1, "none": 1}, start=50)
    first = AgentGrad(
        feedback_metric, log_dir=tmp_path, config=AgentGradConfig.from_options(max_rounds=2, **FAST)
    ).compile(Pipeline(), trainset=train, valset=val)
    with open(tmp_path / "memo.jsonl", "a") as handle:
        handle.write('{"key": "eval:cut-short", "val')
    again = AgentGrad(
        feedback_metric, log_dir=tmp_path, config=AgentGradConfig.from_options(max_rounds=2, **FAST)
    ).compile(Pipeline(), trainset=train, valset=val)
    assert again.detailed_results.final_instructions == first.detailed_results.final_instructions
    assert again.detailed_results.usage["task"] == first.detailed_results.usage["task"]
    lines = (tmp_path / "memo.jsonl").read_text().splitlines()
    assert all(json.loads(line) for line in lines)


# ---- LM faults -----------------------------------------------------------------------------------


def _compile_with(engine, threads: int = 1, retry_attempts: int = 3, lm_retries: int = 0, metric=feedback_metric):
    dspy.configure(lm=fake_lm(engine, num_retries=lm_retries))
    train = make_data({"extract": 3, "notes": 2, "answer": 2, "either": 1, "none": 2})
    val = make_data({"extract": 2, "notes": 2, "answer": 1, "none": 2}, start=50)
    return (
        AgentGrad(
            metric,
            num_threads=threads,
            config=AgentGradConfig.from_options(
                max_rounds=3, cluster_schedule=(1,), retry_attempts=retry_attempts, **FAST
            ),
        )
        .compile(Pipeline(), trainset=train, valset=val)
        .detailed_results
    )


@pytest.fixture(scope="module")
def fault_free():
    from dspy_agentgrad.testing import RuleEngine

    return _compile_with(RuleEngine(World()))


@pytest.mark.parametrize("kind", ["rate_limit", "timeout"])
@pytest.mark.parametrize("rate", [0.1, 0.5])
def test_transient_lm_faults_are_retried_by_the_lm_alone_and_change_nothing(fault_free, kind, rate):
    """One retry layer: the LM's own num_retries recovers every fault; AgentGrad retries none again."""
    engine = FaultyEngine(World(), rate=rate, kind=kind, seed=3)
    result = _compile_with(engine, threads=2, retry_attempts=5, lm_retries=1)  # each prompt fails once
    assert engine.faults > 0
    assert result.program_errors.get("retries", 0) == 0 and result.program_errors.get("transient", 0) == 0
    assert not any("transient" in k for k in result.prompt_role_failures)
    assert result.final_instructions == fault_free.final_instructions
    assert [(c.predictor, c.accepted) for c in result.candidates] == [
        (c.predictor, c.accepted) for c in fault_free.candidates
    ]
    assert result.best_val_score == fault_free.best_val_score


def test_an_lm_error_left_after_the_lms_own_retries_is_not_retried_again():
    """Retries never multiply: with num_retries=1, each prompt is sent twice, whatever retry_attempts says."""
    engine = FaultyEngine(World(), rate=1.0, kind="rate_limit", failures_per_prompt=100)
    result = _compile_with(engine, retry_attempts=5, lm_retries=1)
    assert result.program_errors["transient"] > 0 and result.program_errors.get("retries", 0) == 0
    assert set(engine._sent.values()) == {2}  # stacked retries would send each prompt 2 x 5 = 10 times


@pytest.mark.parametrize("rate", [0.1, 0.5])
def test_garbage_replies_are_counted_and_never_scored_as_success(rate):
    # Every success the result reports on a validation example must be one the metric gave on a well-formed
    # answer: a run whose reply could not be parsed fails, whatever the example.
    engine = FaultyEngine(World(), rate=rate, kind="garbage", seed=5, failures_per_prompt=10)
    successes: set[str] = set()

    def metric(gold, pred, trace=None, pred_name=None, pred_trace=None):
        result = feedback_metric(gold, pred)
        if result.score == 1.0:
            assert re.fullmatch(r"ans-id\d+", pred.answer)
            successes.add(example_label(gold))
        return result

    result = _compile_with(engine, metric=metric)
    assert engine.faults > 0 and result.program_errors.get("parse", 0) > 0
    passed = [v.example for v in result.val_examples if v.initial == 1.0 or v.best == 1.0]
    assert set(passed) <= successes and (passed or rate > 0.3)  # at 0.1 some examples pass (at 0.5 none may)
    assert result.initial_val_score * len(result.val_examples) == sum(v.initial for v in result.val_examples)
    assert result.best_val_score * len(result.val_examples) == sum(v.best for v in result.val_examples)


def test_lasting_outage_scores_failures_and_the_run_ends_cleanly():
    engine = FaultyEngine(World(), rate=1.0, kind="rate_limit", failures_per_prompt=100)
    result = _compile_with(engine)
    assert result.initial_val_score == 0.0 == result.best_val_score
    assert result.program_errors["transient"] > 0
    assert not result.accepted


# ---- interruption and caps ------------------------------------------------------------------------


def test_ctrl_c_returns_the_best_program_so_far_and_keeps_results(tmp_path):
    dspy.configure(lm=world_lm(World()))
    calls = []

    def metric(gold, pred, trace=None, pred_name=None, pred_trace=None):
        calls.append(1)
        if len(calls) == 33:  # after the first accepted rewrite (35 calls in all)
            raise KeyboardInterrupt
        return feedback_metric(gold, pred)

    train = make_data({"extract": 3, "notes": 2, "answer": 2, "none": 2})
    val = make_data({"extract": 2, "notes": 2, "answer": 1, "none": 2}, start=50)
    # one by one: stacked ahead or validated together, this short run's checks would all be paid before
    # its first acceptance
    compiled = AgentGrad(
        metric,
        log_dir=tmp_path,
        config=AgentGradConfig.from_options(
            max_rounds=5, cluster_schedule=(1,), speculate=False, validate_together=False, **FAST
        ),
    ).compile(Pipeline(), trainset=train, valset=val)
    result = compiled.detailed_results
    assert result.interrupted and "interrupted" in result.stop_reason
    assert result.accepted and result.best_val_score > result.initial_val_score
    assert compiled.answer.signature.instructions == result.final_instructions["answer"]
    saved = json.loads((tmp_path / "result.json").read_text())
    assert saved["interrupted"] is True and saved["best_val_score"] == result.best_val_score


def test_prompt_token_cap_stops_cleanly():
    dspy.configure(lm=world_lm(World()))
    train = make_data({"extract": 3, "notes": 2, "answer": 2})
    val = make_data({"extract": 1, "notes": 1, "none": 1}, start=50)
    result = (
        AgentGrad(
            feedback_metric,
            config=AgentGradConfig.from_options(max_rounds=5, max_prompt_tokens=300, cluster_schedule=(1,), **FAST),
        )
        .compile(Pipeline(), trainset=train, valset=val)
        .detailed_results
    )
    assert "prompt-LM token budget" in result.stop_reason
    assert result.usage["prompt"]["prompt_tokens"] + result.usage["prompt"]["completion_tokens"] < 300 + 2000


def test_prompt_cost_cap_prices_tokens_with_litellm_and_stops_cleanly():
    world = World()
    dspy.configure(lm=world_lm(world))
    priced = fake_lm(world, name="openai/gpt-4o-mini")  # litellm's bundled price table knows this model
    priced.kwargs["max_tokens"] = 60  # the completion bound that hard caps reserve for each call
    train = make_data({"extract": 3, "notes": 2, "answer": 2})
    val = make_data({"extract": 1, "notes": 1, "none": 1}, start=50)
    result = (
        AgentGrad(
            feedback_metric,
            prompt_model=priced,
            config=AgentGradConfig.from_options(max_rounds=5, max_prompt_cost=0.0004, cluster_schedule=(1,), **FAST),
        )
        .compile(Pipeline(), trainset=train, valset=val)
        .detailed_results
    )
    assert "prompt-LM cost budget" in result.stop_reason
    assert 0 < result.usage["prompt_cost_usd"] <= 0.0004  # a hard cap: admitted calls' worst cases fit under it
    assert f"${result.usage['prompt_cost_usd']:.4f} of $0.0004 paid" in result.stop_reason
    with pytest.raises(ValueError, match="litellm has none"):
        AgentGrad(
            feedback_metric, config=AgentGradConfig.from_options(max_rounds=1, max_prompt_cost=1.0, **FAST)
        ).compile(Pipeline(), trainset=train, valset=val)
