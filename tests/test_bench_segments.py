"""The head-to-head runner accounts for every segment of a run that was killed and resumed."""

import time
from types import SimpleNamespace

import pytest

from benchmarks import load_benchmark, segments
from benchmarks.fake_world import BenchWorld
from benchmarks.harness import run_optimizer
from dspy_agentgrad.testing import fake_lm


@pytest.fixture(autouse=True)
def _restore_dspy_cache():
    import dspy

    saved = dspy.cache
    yield
    dspy.cache = saved


def _agentgrad(bench, world, log_dir, budget):
    return run_optimizer(
        "agentgrad",
        bench.make_program(),
        bench.trainset,
        bench.valset,
        bench.metric,
        task_lm=fake_lm(world),
        prompt_lm=fake_lm(world),
        max_metric_calls=budget,
        num_threads=2,
        hint_fn=bench.hint,
        log_dir=log_dir,
        cache_dir="off",
    )


def test_a_rerun_on_the_same_log_dir_reports_the_totals_of_every_segment(tmp_path):
    pytest.importorskip("bm25s", reason="HotpotQA retrieval needs the [bench] extra")
    bench = load_benchmark("hotpotqa", train=8, val=6, test=6, seed=0, corpus="pooled")
    world = BenchWorld(bench.trainset + bench.valset + bench.testset)
    first = _agentgrad(bench, world, tmp_path, 60)
    again = _agentgrad(bench, world, tmp_path, 60)  # AgentGrad replays its journal: nothing paid again
    assert [s["metric_calls"] for s in again.segments] == [first.metric_calls, 0]
    assert again.metric_calls == first.metric_calls and again.usage["task"] == first.usage["task"]
    assert again.wall_time_s == pytest.approx(sum(s["wall_time_s"] for s in again.segments))
    assert again.to_dict()["within_budget"] is True


def test_a_killed_segment_is_counted_up_to_its_last_save(tmp_path, monkeypatch):
    monkeypatch.setattr(segments, "SAVE_INTERVAL_S", 0.01)
    counter = SimpleNamespace(calls=0, feedback_calls=0)
    meter = SimpleNamespace(snapshot=lambda: {"task": {"calls": counter.calls * 3}})
    killed = segments.SegmentLog(tmp_path, meter, counter).__enter__()
    counter.calls = 250
    time.sleep(0.2)
    killed._stop.set()  # the process dies here: no finish(), no __exit__
    killed._saver.join()
    counter.calls = 0
    with segments.SegmentLog(tmp_path, meter, counter) as resumed:
        counter.calls = 60
        resumed.finish(60)
    totals = resumed.totals()
    assert totals["metric_calls"] == 310 and totals["usage"]["task"]["calls"] == 3 * 310
    assert [s["finished"] for s in resumed.segments] == [False, True]
