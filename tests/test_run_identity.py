"""A run's identity: stable across processes for any example data, covering the endpoint and the adapter;
journal records tied to their run; budgets that a resume can extend; mismatches that name what differs."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import dspy
import pytest
from world import Pipeline, World, agentgrad, dumps, feedback_metric, make_data, world_lm

from dspy_agentgrad import RunMismatch
from dspy_agentgrad.testing import fake_lm

JOB = Path(__file__).parent / "resume_job.py"
FAST = dict(auto=None, progress=False)
TRAIN = make_data({"extract": 2, "notes": 2, "answer": 1, "none": 1})
VAL = make_data({"extract": 1, "notes": 1, "none": 1}, start=50)
MODEL = "openai/gpt-4o-mini"


def compile_once(log_dir, metric_fn=feedback_metric, trainset=TRAIN, **options):
    options = {"max_rounds": 1, **FAST, **options}
    return agentgrad(metric_fn, log_dir=log_dir, **options).compile(Pipeline(), trainset=trainset, valset=VAL)


def decisions(result) -> str:
    keep = ("candidates", "rounds", "final_instructions", "best_val_score", "val_history", "metric_calls")
    return dumps({k: v for k, v in result.to_dict().items() if k in keep})


# ---- stable across processes, for any example data --------------------------------------------------


def run_job(log_dir: Path, out: Path, **env) -> int:
    environment = {**os.environ, "ALIASES": "1", **env}
    return subprocess.run([sys.executable, str(JOB), str(log_dir), str(out)], env=environment, timeout=300).returncode


def test_set_valued_fields_resume_in_another_process(tmp_path):
    """Examples with set and frozenset fields: killed in one process, resumed in one with another hash seed."""
    log, out = tmp_path / "log", tmp_path / "out.json"
    assert run_job(log, out, KILL_AT="metric:30", PYTHONHASHSEED="1") == -9
    assert run_job(log, out, PYTHONHASHSEED="2") == 0  # before: RunMismatch ... different trainset
    resumed = json.loads(out.read_text())
    assert resumed["resumed"] is True
    killed, finished = resumed["segments"]
    assert killed["metric_calls"] >= 29  # the killed process's work was replayed, not paid again:
    assert killed["metric_calls"] + finished["metric_calls"] <= resumed["metric_calls"] + 1


class Opaque:
    """An object whose repr is its memory address."""


def test_a_field_without_a_stable_encoding_is_refused_naming_the_field(tmp_path):
    dspy.configure(lm=world_lm(World()))
    train = [*TRAIN[:2], TRAIN[2].copy(meta=Opaque())]
    with pytest.raises(TypeError, match=r"trainset\[2\] field 'meta'.*Opaque") as caught:
        compile_once(tmp_path, trainset=train)
    assert "0x" not in str(caught.value)  # never a memory address
    assert not (tmp_path / "memo.jsonl").exists()


# ---- the endpoint and the adapter are part of the identity ----------------------------------------


def test_resume_against_another_api_base_is_refused_without_writing_the_url_or_key(tmp_path):
    world_model = fake_lm(World(), name=MODEL)
    dspy.configure(lm=world_model)
    compile_once(tmp_path)
    other = dspy.LM(MODEL, api_base="http://127.0.0.1:9/v1", api_key="sk-never-written-anywhere-123", cache=False)
    with pytest.raises(RunMismatch, match=r"task_lm\.endpoint") as caught:
        compile_once(tmp_path, task_model=other, prompt_model=world_model)
    assert "127.0.0.1" not in str(caught.value)  # a digest of the endpoint, not the URL
    run_json = (tmp_path / "run.json").read_text()
    assert "127.0.0.1" not in run_json and "sk-never" not in run_json


def test_resume_under_another_adapter_is_refused(tmp_path):
    dspy.configure(lm=world_lm(World()))
    compile_once(tmp_path)
    with dspy.context(adapter=dspy.JSONAdapter()):
        with pytest.raises(RunMismatch, match=r"adapter.*JSONAdapter"):
            compile_once(tmp_path)
    with dspy.context(adapter=dspy.ChatAdapter(use_json_adapter_fallback=False)):
        with pytest.raises(RunMismatch, match=r"use_json_adapter_fallback"):
            compile_once(tmp_path)


# ---- journal records tied to their run --------------------------------------------------------------


def zero_metric(gold, pred, trace=None):
    return 0.0


def test_records_of_another_run_appended_to_the_journal_are_refused(tmp_path, caplog):
    dspy.configure(lm=world_lm(World()))
    first = compile_once(tmp_path / "a").detailed_results
    compile_once(tmp_path / "b", zero_metric)  # same program and data, a metric that always scores 0
    with open(tmp_path / "a" / "memo.jsonl", "a", encoding="utf-8") as journal:
        journal.write((tmp_path / "b" / "memo.jsonl").read_text(encoding="utf-8"))
    with caplog.at_level(logging.WARNING, logger="dspy_agentgrad"):
        again = compile_once(tmp_path / "a").detailed_results
    assert again.best_val_score == first.best_val_score > 0
    assert decisions(again) == decisions(first)
    assert "another run" in caplog.text and "memo.jsonl" in caplog.text


# ---- a resumed run can be extended ------------------------------------------------------------------


def test_a_run_that_reached_max_rounds_continues_with_a_larger_max_rounds(tmp_path):
    # max_rounds=2 ends at the end of a window of stack_rounds=2 rounds: no winner is left waiting for a
    # validation pass that the longer run, whose window goes on, would not make
    dspy.configure(lm=world_lm(World()))
    two = compile_once(tmp_path / "run", max_rounds=2).detailed_results
    assert two.stop_reason == "max_rounds=2 reached"
    extended = compile_once(tmp_path / "run", max_rounds=4).detailed_results
    fresh = compile_once(tmp_path / "fresh", max_rounds=4).detailed_results
    assert extended.resumed and decisions(extended) == decisions(fresh)
    assert extended.segments[-1]["metric_calls"] == fresh.metric_calls - two.metric_calls  # nothing paid twice


def test_a_run_stopped_inside_a_window_continues_with_the_decisions_of_a_fresh_run(tmp_path):
    # max_rounds=1 stops inside the first window: its waiting winners were validated on the way out, a pass
    # the longer run (which validates them with round 1's) does not make, so only that pass is paid again
    dspy.configure(lm=world_lm(World()))
    one = compile_once(tmp_path / "run", max_rounds=1).detailed_results
    extended = compile_once(tmp_path / "run", max_rounds=3).detailed_results
    fresh = compile_once(tmp_path / "fresh", max_rounds=3).detailed_results
    assert extended.resumed and decisions(extended) == decisions(fresh)
    assert fresh.metric_calls - one.metric_calls < extended.segments[-1]["metric_calls"] <= fresh.metric_calls


def test_a_run_that_spent_its_budget_continues_with_a_larger_budget(tmp_path):
    dspy.configure(lm=world_lm(World()))
    small = compile_once(tmp_path / "run", max_rounds=None, max_metric_calls=20).detailed_results
    assert small.stop_reason.startswith("budget exhausted")
    extended = compile_once(tmp_path / "run", max_rounds=None, max_metric_calls=60, max_prompt_tokens=10**6)
    fresh = compile_once(tmp_path / "fresh", max_rounds=None, max_metric_calls=60, max_prompt_tokens=10**6)
    assert decisions(extended.detailed_results) == decisions(fresh.detailed_results)
    assert extended.detailed_results.metric_calls > small.metric_calls


def test_a_resume_may_turn_speculation_on_or_off(tmp_path):
    """``speculate`` changes no decision, so a run recorded with it on (its default once) resumes with it off."""
    dspy.configure(lm=world_lm(World()))
    first = compile_once(tmp_path / "run", max_rounds=1, num_threads=2, speculate=True).detailed_results
    resumed = compile_once(tmp_path / "run", max_rounds=2, num_threads=2).detailed_results
    fresh = compile_once(tmp_path / "fresh", max_rounds=2, num_threads=2).detailed_results
    assert resumed.resumed and first.options["speculate"] and not resumed.options["speculate"]
    assert decisions(resumed) == decisions(fresh)


def test_a_mismatch_lists_only_the_keys_that_differ_and_how_to_allow_it(tmp_path):
    dspy.configure(lm=world_lm(World()))
    compile_once(tmp_path)
    with pytest.raises(RunMismatch) as caught:
        compile_once(tmp_path, seed=7, train_batch_size=5)
    message = str(caught.value)
    assert "options.seed: 0 -> 7" in message and "options.train_batch_size: 16 -> 5" in message
    assert "max_score" not in message and "cluster_schedule" not in message
    assert "resume_despite=('options',)" in message
    assert "pass the options it recorded (seed=0, train_batch_size=16) to resume it as it was" in message
    resumed = compile_once(tmp_path, seed=7, train_batch_size=5, resume_despite=("options",)).detailed_results
    assert resumed.resumed
