"""Every task-LM answer paid for survives a kill: a resumed run pays again only for the calls in flight.

The job (``resume_job.py``) is killed right after the world's LM answered a task call, before the
program sees the answer, at points inside round 1 (stacked candidate checks run ahead, validation runs)
and with SIGTERM as well as SIGKILL. Task-LM calls are counted across both processes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

JOB = Path(__file__).parent / "resume_job.py"


def run_job(folder: Path, **env) -> int:
    environment = {
        **os.environ,
        "LEDGER": str(folder / "metric_calls"),
        "TASK_LEDGER": str(folder / "task_calls"),
        **env,
    }
    command = [sys.executable, str(JOB), str(folder / "log"), str(folder / "out.json")]
    return subprocess.run(command, env=environment, timeout=300).returncode


def task_calls(folder: Path) -> int:
    return len((folder / "task_calls").read_text().splitlines())


def decisions(folder: Path) -> dict:
    result = json.loads((folder / "out.json").read_text())
    keep = ("candidates", "rounds", "final_instructions", "best_val_score", "metric_calls", "task_spend")
    keep += ("val_history",)
    return {k: result[k] for k in keep}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    runs = {}
    for threads, speculate in (("1", "1"), ("4", "1"), ("1", "0")):
        folder = tmp_path_factory.mktemp(f"whole-{threads}-{speculate}")
        assert run_job(folder, THREADS=threads, SPECULATE=speculate) == 0
        runs[threads, speculate] = (decisions(folder), task_calls(folder))
    return runs


@pytest.mark.parametrize(
    ("kill_at", "threads", "speculate", "signal"),
    [
        ("task:80", "1", "1", "KILL"),  # round 1's stacked candidate checks, run ahead
        ("task:110", "1", "1", "KILL"),  # the validation runs of round 1's candidates
        ("task:100", "1", "1", "TERM"),
        ("task:100", "4", "1", "TERM"),
        ("task:100", "1", "0", "KILL"),
    ],
)
def test_a_killed_run_pays_again_only_for_the_answers_in_flight(
    tmp_path, uninterrupted, kill_at, threads, speculate, signal
):
    expected, expected_calls = uninterrupted[threads, speculate]
    settings = dict(THREADS=threads, SPECULATE=speculate)
    assert run_job(tmp_path, KILL_AT=kill_at, KILL_SIGNAL=signal, **settings) < 0  # killed by the signal
    assert run_job(tmp_path, **settings) == 0
    assert decisions(tmp_path) == expected
    in_flight = int(threads)  # answered but not yet journaled when the signal came: at most one per thread
    assert expected_calls <= task_calls(tmp_path) <= expected_calls + in_flight


# ---- a run a cap stopped, compiled again ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("cap", "value"), [("max_task_tokens", 15000), ("max_task_tokens", 25000), ("max_prompt_tokens", 50000)]
)
def test_compiling_again_a_run_a_token_cap_stopped_pays_nothing_and_changes_nothing(tmp_path, cap, value):
    import dspy
    from world import Pipeline, World, feedback_metric, make_data, world_lm

    from dspy_agentgrad import AgentGrad
    from dspy_agentgrad.config import AgentGradConfig

    train = make_data({"extract": 3, "notes": 3, "answer": 2, "none": 2})
    val = make_data({"extract": 2, "notes": 2, "answer": 2, "none": 2}, start=50)
    results = []
    for _ in range(3):
        world = World()
        dspy.configure(lm=world_lm(world))
        optimizer = AgentGrad(
            feedback_metric,
            auto=None,
            log_dir=tmp_path,
            config=AgentGradConfig.from_options(max_rounds=4, progress=False, **{cap: value}),
        )
        result = optimizer.compile(Pipeline(), trainset=train, valset=val).detailed_results
        results.append((result, sum(world.calls.values())))
    (first, first_calls), *again = results
    assert first.stop_reason.startswith("budget exhausted") and first_calls > 0  # the cap stopped the run
    for result, calls in again:
        assert calls == 0  # nothing paid again
        assert (result.best_val_score, result.final_instructions, result.stop_reason) == (
            first.best_val_score,
            first.final_instructions,
            first.stop_reason,
        )


# ---- caps count the whole prompt ----------------------------------------------------------------------


def test_a_task_calls_worst_case_counts_the_demonstrations_it_shows():
    import dspy

    from dspy_agentgrad.runtime.budget import estimated_tokens, task_ticket
    from dspy_agentgrad.testing import RuleEngine, fake_lm

    lm = fake_lm(RuleEngine(lambda call: {"answer": "x"}))
    signature = dspy.Signature("question -> answer")
    note = "a long worked example that the prompt shows before the question " * 30
    demos = [dspy.Example(question=note, answer=note) for _ in range(4)]
    bare = task_ticket(lm, signature, {"question": "q"})
    shown = task_ticket(lm, signature, {"question": "q"}, demos)
    assert shown.tokens - bare.tokens >= 2 * estimated_tokens(note) * len(demos)  # each request shows them all


def test_the_estimate_pays_within_every_cap():
    import dspy
    from world import Pipeline, World, feedback_metric, make_data, world_lm

    from dspy_agentgrad import AgentGrad
    from dspy_agentgrad.config import AgentGradConfig
    from dspy_agentgrad.runtime.budget import BudgetExhausted

    world = World()
    dspy.configure(lm=world_lm(world))
    optimizer = AgentGrad(
        feedback_metric, auto=None, config=AgentGradConfig.from_options(max_rounds=2, progress=False, max_task_calls=10)
    )
    train = make_data({"extract": 6, "notes": 6, "answer": 4, "none": 4})
    with pytest.raises(BudgetExhausted, match="the estimate's sample .* reached a cap"):
        optimizer.estimate(Pipeline(), trainset=train, sample_size=8)
    task_calls = sum(world.calls[name] for name in ("extract", "notes", "answer"))
    assert 0 < task_calls <= 10
