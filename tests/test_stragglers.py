"""A program run or metric call that hangs cannot hold up a round: past ``run_timeout_s`` (``metric_timeout_s``)
it is abandoned, counted as a ``timeout`` error, tried once more, then scored as a failure; a resume replays
the failure from the journal instead of waiting again."""

from __future__ import annotations

import threading
import time

import dspy
import pytest
from world import Pipeline, World, feedback_metric, make_data, world_lm

from dspy_agentgrad import AgentGrad, FirstRunsFailed
from dspy_agentgrad.config import AgentGradConfig
from dspy_agentgrad.program.evaluation import Evaluator
from dspy_agentgrad.program.metric import Metric
from dspy_agentgrad.program.runner import TIMEOUT_METRIC, TIMEOUT_RUN, ProgramRunner
from dspy_agentgrad.runtime.budget import Budget
from dspy_agentgrad.runtime.store import Memo
from dspy_agentgrad.runtime.usage import UsageLedger

TIMEOUT = 0.4
MARGIN = 1.5  # seconds: thread start-up and the other runs on a shared 2-core machine
RELEASE = threading.Event()  # set after each test: the abandoned threads end
ENTERED: list[str] = []  # one entry per run that reached the hanging tool


@pytest.fixture(autouse=True)
def _release_hung_threads():
    RELEASE.clear()
    ENTERED.clear()
    yield
    RELEASE.set()


class HangingTool(Pipeline):
    """The world's pipeline whose tool hangs (until released) on one question: ``id7``."""

    def forward(self, question):
        if question.startswith("id7 "):
            ENTERED.append(question)
            RELEASE.wait(120)
        return super().forward(question)


TRAIN = make_data({"extract": 8, "notes": 6, "answer": 3, "none": 3})  # 20 examples; id7 is among them
VAL = make_data({"extract": 2, "none": 2}, start=50)


def evaluator(metric=feedback_metric, threads=4, **timeouts) -> Evaluator:
    runner = ProgramRunner(HangingTool(), Metric(metric), world_lm(World()), **timeouts)
    return Evaluator(runner, Memo(), Budget(), UsageLedger(), num_threads=threads)


def test_a_run_that_hangs_is_abandoned_retried_once_and_scored_as_a_timeout_failure():
    dspy.configure(lm=world_lm(World()))
    ev = evaluator(run_timeout_s=TIMEOUT)
    started = time.perf_counter()
    outcomes = ev.evaluate(_instructions(), TRAIN, "minibatch")
    wall = time.perf_counter() - started
    hung = [o for ex, o in zip(TRAIN, outcomes) if ex.question.startswith("id7 ")]
    assert len(hung) == 1 and hung[0].error == TIMEOUT_RUN and hung[0].score == 0.0
    assert hung[0].attempts == 2 and len(ENTERED) == 2  # the first try and one retry, no more
    assert "longer than 0.4 s" in hung[0].feedback
    assert all(o.error is None for ex, o in zip(TRAIN, outcomes) if not ex.question.startswith("id7 "))
    assert ev.errors["timeout"] == 1 and ev.errors[TIMEOUT_RUN] == 1
    # the batch of 20 ends within the two tries of the hung run plus a small margin (it would wait 120 s)
    assert wall < 2 * TIMEOUT + MARGIN, wall


def test_without_a_limit_the_same_batch_waits_for_the_hung_run():
    """The check above can fail: with no run_timeout_s the batch is still waiting when the tool is released."""
    dspy.configure(lm=world_lm(World()))
    ev = evaluator()
    done = threading.Event()
    threading.Thread(target=lambda: (ev.evaluate(_instructions(), TRAIN, "minibatch"), done.set()), daemon=True).start()
    assert not done.wait(2 * TIMEOUT + MARGIN)
    RELEASE.set()
    assert done.wait(30)


def test_a_metric_that_hangs_scores_failure_score_after_one_retry():
    dspy.configure(lm=world_lm(World()))
    calls = []

    def slow_on_id3(gold, pred, trace=None):
        calls.append(gold.question)
        if gold.question.startswith("id3 "):
            RELEASE.wait(120)
        return feedback_metric(gold, pred)

    runner = ProgramRunner(
        Pipeline(), Metric(slow_on_id3), world_lm(World()), failure_score=0.25, metric_timeout_s=TIMEOUT
    )
    outcome = runner.run(TRAIN[3], _instructions())
    assert outcome.error == TIMEOUT_METRIC and outcome.score == 0.25
    assert calls.count(TRAIN[3].question) == 2
    assert runner.run(TRAIN[4], _instructions()).error is None


def test_a_round_with_a_hung_tool_ends_counts_the_timeout_and_a_resume_does_not_wait_again(tmp_path):
    dspy.configure(lm=world_lm(World()))
    options = dict(
        auto=None,
        max_rounds=1,
        progress=False,
        train_batch_size=20,
        num_threads=4,
        run_timeout_s=TIMEOUT,
    )
    started = time.perf_counter()
    first = AgentGrad(feedback_metric, log_dir=tmp_path, config=AgentGradConfig.from_options(**options)).compile(
        HangingTool(), trainset=TRAIN, valset=VAL
    )
    wall = time.perf_counter() - started
    result = first.detailed_results
    assert result.program_errors.get("timeout", 0) >= 1 and result.program_errors.get(TIMEOUT_RUN, 0) >= 1
    assert result.best_val_score > result.initial_val_score  # the round went on and learned from the others
    assert wall < 60  # the tool hangs for 120 s per run it reaches
    entered = len(ENTERED)

    started = time.perf_counter()
    again = AgentGrad(feedback_metric, log_dir=tmp_path, config=AgentGradConfig.from_options(**options)).compile(
        HangingTool(), trainset=TRAIN, valset=VAL
    )
    assert again.detailed_results.resumed
    assert len(ENTERED) == entered  # every abandoned run was replayed from the journal: none was made again
    assert time.perf_counter() - started < TIMEOUT + MARGIN
    assert again.detailed_results.program_errors == result.program_errors
    assert again.detailed_results.final_instructions == result.final_instructions


def test_a_limit_every_first_run_exceeds_stops_the_run_saying_which_option_to_raise():
    dspy.configure(lm=world_lm(World()))
    everything_hangs = [  # the tool hangs on every question about id7
        dspy.Example(question=f"id7 kind=none v{j}", answer="ans-id7").with_inputs("question") for j in range(3)
    ]
    with pytest.raises(
        FirstRunsFailed, match=r"each of its first 3 runs went past its time limit twice.*run_timeout_s"
    ):
        AgentGrad(
            feedback_metric,
            auto=None,
            config=AgentGradConfig.from_options(max_rounds=1, progress=False, run_timeout_s=TIMEOUT),
        ).compile(HangingTool(), trainset=TRAIN[:4], valset=everything_hangs)


def test_time_limits_must_be_positive_numbers():
    for bad in (0, -1, "5", float("nan"), True):
        with pytest.raises(ValueError, match="run_timeout_s must be a finite number"):
            AgentGrad(feedback_metric, config=AgentGradConfig.from_options(run_timeout_s=bad))
    with pytest.raises(ValueError, match="metric_timeout_s"):
        AgentGrad(feedback_metric, config=AgentGradConfig.from_options(metric_timeout_s=0))


def _instructions() -> dict[str, str]:
    return {name: p.signature.instructions for name, p in Pipeline().named_predictors()}
