"""Runs that can't be fooled: resume identity, score range, LM types, hard prompt-LM caps, the log_dir
lock, a damaged journal, accounting across resumes, clear errors for bad input, Retry-After."""

from __future__ import annotations

import importlib.util
import json
import logging
import subprocess
import sys
import time

import dspy
import pytest
from world import Pipeline, World, agentgrad, dumps, feedback_metric, make_data, metric, world_lm

from dspy_agentgrad import AgentGrad, MetricError, RunMismatch
from dspy_agentgrad.config import AgentGradConfig
from dspy_agentgrad.roles import signatures
from dspy_agentgrad.runtime.retries import RetryPolicy
from dspy_agentgrad.runtime.run_lock import LogDirBusy
from dspy_agentgrad.runtime.store import Memo
from dspy_agentgrad.testing import RuleEngine, fake_lm

FAST = dict(auto=None, progress=False)
TRAIN = make_data({"extract": 2, "notes": 1, "answer": 1})
VAL = make_data({"extract": 1, "none": 1}, start=50)


def compile_once(log_dir=None, metric_fn=feedback_metric, trainset=TRAIN, **options):
    options = {"max_rounds": 1, **FAST, **options}
    return agentgrad(metric_fn, log_dir=log_dir, **options).compile(Pipeline(), trainset=trainset, valset=VAL)


def other_metric(gold, pred, trace=None):
    return float(getattr(pred, "answer", None) == gold.answer)


# ---- 1. the resume fingerprint holds the metric, the LMs and the prompts -----------------------------


def test_resume_with_another_metric_is_refused_and_can_be_allowed_knowingly(tmp_path):
    dspy.configure(lm=world_lm(World()))
    compile_once(tmp_path)
    with pytest.raises(RunMismatch, match=r"different metric .*test_reliability\.other_metric.*resume_despite"):
        compile_once(tmp_path, other_metric)
    resumed = compile_once(tmp_path, other_metric, resume_despite=("metric",)).detailed_results
    assert resumed.resumed
    compile_once(tmp_path, other_metric)  # the run now records the new metric


def _metric_module(folder, body: str):
    folder.mkdir()
    path = folder / "user_metric.py"
    path.write_text(f"def score(gold, pred, trace=None):\n    return {body}\n")
    spec = importlib.util.spec_from_file_location("user_metric", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.score


def test_a_metric_whose_code_changed_under_the_same_name_is_refused(tmp_path):
    dspy.configure(lm=world_lm(World()))
    before = _metric_module(tmp_path / "a", "float(pred.answer == gold.answer)")
    after = _metric_module(tmp_path / "b", "float(gold.answer in pred.answer)")
    compile_once(tmp_path / "log", before)
    with pytest.raises(RunMismatch, match="different metric"):
        compile_once(tmp_path / "log", after)


class CountingWrapper:
    """A metric wrapper as benchmark harnesses write them."""

    def __init__(self, metric):
        self.metric = metric

    def __call__(self, gold, pred, trace=None):
        return self.metric(gold, pred, trace)


def test_a_wrapper_around_another_metric_is_refused(tmp_path):
    dspy.configure(lm=world_lm(World()))
    compile_once(tmp_path, CountingWrapper(metric))
    with pytest.raises(RunMismatch, match="different metric.*other_metric"):
        compile_once(tmp_path, CountingWrapper(other_metric))


@pytest.mark.parametrize("role", ["task_model", "prompt_model"])
@pytest.mark.parametrize("change", ["model", "temperature"])
def test_resume_with_another_task_or_prompt_lm_is_refused(tmp_path, role, change):
    world = World()
    dspy.configure(lm=world_lm(world))
    compile_once(tmp_path, **{role: world_lm(world)})
    other = fake_lm(world, name="fake/other") if change == "model" else world_lm(world)
    if change == "temperature":
        other.kwargs["temperature"] = 0.7
    lm_part = "task_lm" if role == "task_model" else "prompt_lm"
    with pytest.raises(RunMismatch, match=f"different {lm_part}"):
        compile_once(tmp_path, **{role: other})


def test_resume_after_the_optimizer_prompts_changed_is_refused(tmp_path, monkeypatch):
    dspy.configure(lm=world_lm(World()))
    compile_once(tmp_path)
    changed = signatures.RewriteInstruction.with_instructions("Rewrite the instruction, differently.")
    monkeypatch.setattr(signatures, "RewriteInstruction", changed)
    with pytest.raises(RunMismatch, match="different prompts"):
        compile_once(tmp_path)


def test_the_fingerprint_never_holds_credentials(tmp_path):
    lm = world_lm(World())
    lm.kwargs.update(api_key="sk-very-secret", api_base="http://10.0.0.7:8000/v1", temperature=0.0)
    compile_once(tmp_path, task_model=lm, prompt_model=lm)
    text = (tmp_path / "run.json").read_text()
    assert "sk-very-secret" not in text and "10.0.0.7" not in text
    assert json.loads(text)["task_lm"]["settings"] == {"temperature": 0.0}


def test_resume_despite_names_only_known_parts():
    with pytest.raises(ValueError, match="resume_despite accepts"):
        AgentGrad(
            feedback_metric, config=AgentGradConfig.from_options(max_rounds=1, resume_despite=("trainset",), **FAST)
        )


# ---- 2. scores above max_score ----------------------------------------------------------------------


def percent_metric(gold, pred, trace=None):
    return 100.0 * (getattr(pred, "answer", None) == gold.answer)


def test_a_score_above_max_score_names_the_example_and_the_fix():
    dspy.configure(lm=world_lm(World()))
    with pytest.raises(MetricError, match=r"scored 100.0 on the example .*id5\d.*max_score=100"):
        compile_once(metric_fn=percent_metric)
    percent = compile_once(metric_fn=percent_metric, max_score=100).detailed_results
    unit = compile_once(metric_fn=metric).detailed_results
    assert percent.best_val_score == 100 * unit.best_val_score
    assert percent.final_instructions == unit.final_instructions


def test_a_negative_score_is_a_score_below_max_score():
    dspy.configure(lm=world_lm(World()))
    result = compile_once(metric_fn=lambda gold, pred, trace=None: -1.0).detailed_results
    assert result.initial_val_score == -1.0 == result.best_val_score


# ---- 3. task and prompt models are LMs ------------------------------------------------------------


@pytest.mark.parametrize("role", ["task_model", "prompt_model"])
def test_a_model_name_string_is_not_an_lm(role):
    with pytest.raises(TypeError, match=rf"{role} must be a dspy.BaseLM.*dspy.LM\('openai/gpt-5-mini'\)"):
        AgentGrad(
            feedback_metric, **{role: "openai/gpt-5-mini"}, config=AgentGradConfig.from_options(max_rounds=1, **FAST)
        )


def test_a_configured_lm_that_is_not_an_lm_is_refused():
    dspy.configure(lm="openai/gpt-5-mini")
    with pytest.raises(TypeError, match="task LM"):
        compile_once()


# ---- 4. hard prompt-LM caps ----------------------------------------------------------------------------


def _capped_run(threads: int, cap: int | None):
    world = World()
    lm = world_lm(world)
    lm.kwargs["max_tokens"] = 40  # the fake LM's replies are a few words: 40 bounds every completion
    dspy.configure(lm=lm)
    train = make_data({"extract": 3, "notes": 3, "answer": 3, "either": 1, "none": 2})
    val = make_data({"extract": 2, "notes": 2, "answer": 1, "none": 2}, start=50)
    optimizer = AgentGrad(
        feedback_metric,
        num_threads=threads,
        config=AgentGradConfig.from_options(
            max_rounds=3, cluster_schedule=(1,), train_batch_size=12, max_prompt_tokens=cap, **FAST
        ),
    )
    return optimizer.compile(Pipeline(), trainset=train, valset=val).detailed_results


def _decisions(result) -> str:
    keep = ("candidates", "rounds", "final_instructions", "best_val_score", "val_history", "metric_calls")
    return dumps({k: v for k, v in result.to_dict().items() if k in keep})


def test_prompt_token_caps_are_hard_and_decide_the_same_at_1_and_8_threads():
    uncapped = _capped_run(1, None)
    total = uncapped.usage["prompt"]["prompt_tokens"] + uncapped.usage["prompt"]["completion_tokens"]
    for share in (0.25, 0.5, 0.8):
        cap = int(total * share)
        one, eight = _capped_run(1, cap), _capped_run(8, cap)
        assert _decisions(one) == _decisions(eight), f"cap {cap}"
        for result in (one, eight):
            # which calls of the batch the cap stopped in were paid may differ; the decisions do not
            paid = result.usage["prompt"]["prompt_tokens"] + result.usage["prompt"]["completion_tokens"]
            assert f"prompt-LM token budget: {paid} of {cap} tokens paid" in result.stop_reason
            assert paid <= cap  # worst cases are reserved before a call: never over the cap


# ---- 5. one compile at a time on a log_dir -------------------------------------------------------------


def test_a_second_compile_on_a_busy_log_dir_is_refused_and_a_killed_holder_releases_it(tmp_path):
    dspy.configure(lm=world_lm(World()))
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from dspy_agentgrad.runtime.run_lock import LogDirLock\n"
            "with LogDirLock(sys.argv[1]):\n    print('locked', flush=True); time.sleep(120)",
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(LogDirBusy, match=rf"pid {holder.pid} on host"):
            compile_once(tmp_path)
        assert not (tmp_path / "memo.jsonl").exists()  # refused before paying for anything
    finally:
        holder.kill()
        holder.wait()
    assert compile_once(tmp_path).detailed_results.metric_calls > 0


# ---- 6. a damaged journal line ----------------------------------------------------------------------------


def test_a_damaged_journal_line_is_skipped_and_every_later_record_kept(tmp_path, caplog):
    memo = Memo(tmp_path)
    for i in range(6):
        memo.put(f"k{i}", {"i": i, "text": f"a long passage number {i} " * 5})
    memo.close()
    path = tmp_path / "memo.jsonl"
    lines = path.read_text().splitlines()
    damaged = next(n for n, line in enumerate(lines) if '"key": "k2"' in line)
    lines[damaged] = lines[damaged][: len(lines[damaged]) // 2]
    path.write_text("\n".join(lines) + "\n")
    with caplog.at_level(logging.WARNING, logger="dspy.agentgrad"):
        again = Memo(tmp_path)
    assert again.dropped == 1 and again.loaded == 5
    kept = {f"k{i}": again.get(f"k{i}") for i in range(6)}
    assert kept["k2"] is None and [kept[f"k{i}"]["i"] for i in (0, 1, 3, 4, 5)] == [0, 1, 3, 4, 5]
    assert kept["k5"]["text"].startswith("a long passage number 5")
    assert "skipped 1 damaged line" in caplog.text
    assert path.read_text().startswith("\n".join(lines))  # nothing was deleted


def test_a_resume_pays_again_only_for_the_damaged_record(tmp_path):
    dspy.configure(lm=world_lm(World()))
    calls = []

    def counted(gold, pred, trace=None):
        calls.append(1)
        return metric(gold, pred)

    first = compile_once(tmp_path, counted).detailed_results
    path = tmp_path / "memo.jsonl"
    lines = path.read_text().splitlines()
    damaged = next(n for n, line in enumerate(lines) if '"key": "eval:' in line)
    lines[damaged] = "{not json"
    path.write_text("\n".join(lines) + "\n")
    calls.clear()
    again = compile_once(tmp_path, counted).detailed_results
    assert len(calls) == 1
    assert again.final_instructions == first.final_instructions and again.metric_calls == first.metric_calls


# ---- 7. accounting across resumes ---------------------------------------------------------------------------


def test_a_resumed_result_accounts_for_every_segment(tmp_path):
    dspy.configure(lm=world_lm(World()))
    first = compile_once(tmp_path).detailed_results
    time.sleep(0.05)
    second = compile_once(tmp_path).detailed_results  # everything replayed from the journal
    assert [s["metric_calls"] for s in second.segments] == [first.metric_calls, 0]
    assert second.paid["metric_calls"] == first.metric_calls == second.metric_calls
    assert (
        second.paid["task"] == first.usage["task"] and second.paid["prompt"]["calls"] == first.usage["prompt"]["calls"]
    )
    assert second.wall_time_s == pytest.approx(sum(s["wall_time_s"] for s in second.segments))
    assert second.wall_time_s >= first.wall_time_s
    saved = json.loads((tmp_path / "result.json").read_text())
    assert saved["paid"]["segments"] == 2 and len(saved["segments"]) == 2


# ---- 8. clear errors for bad input ------------------------------------------------------------------------


def test_a_damaged_run_json_names_the_file_and_the_fix(tmp_path):
    dspy.configure(lm=world_lm(World()))
    compile_once(tmp_path)
    (tmp_path / "run.json").write_text('{"format": 2, "progr')
    with pytest.raises(RunMismatch, match=rf"{tmp_path / 'run.json'} is not a readable run fingerprint.*new log_dir"):
        compile_once(tmp_path)


def test_a_lone_surrogate_names_the_example_and_field():
    dspy.configure(lm=world_lm(World()))
    bad = [*TRAIN[:1], dspy.Example(question="id9 kind=none \ud800", answer="ans-id9").with_inputs("question")]
    with pytest.raises(ValueError, match=r"trainset\[1\] field 'question' holds text that is not valid Unicode"):
        compile_once(trainset=bad)


def test_a_generator_trainset_is_read_once_and_works():
    dspy.configure(lm=world_lm(World()))
    from_list = compile_once().detailed_results
    from_generator = compile_once(trainset=(ex for ex in TRAIN)).detailed_results
    assert from_generator.final_instructions == from_list.final_instructions
    assert from_generator.metric_calls == from_list.metric_calls


def test_a_hint_fn_returning_a_dict_is_a_clear_type_error():
    dspy.configure(lm=world_lm(World()))
    with pytest.raises(TypeError, match="hint_fn returned a dict"):
        compile_once(hint_fn=lambda example, name, prediction, feedback: {"hint": "look closer"})


# ---- 9. Retry-After --------------------------------------------------------------------------------------


class _HttpError(Exception):
    def __init__(self, headers):
        super().__init__("429 Too Many Requests")
        self.response = type("Response", (), {"headers": headers})()


def test_retry_after_is_honoured_within_a_bound():
    from dspy.lm15 import RateLimitError

    policy = RetryPolicy(attempts=3, backoff_s=0.5, max_retry_after_s=30)
    assert policy.delay(1) == 0.5
    assert policy.delay(1, RateLimitError("slow down", retry_after=7.0)) == 7.0
    assert policy.delay(1, _HttpError({"retry-after": "3"})) == 3.0
    assert policy.delay(1, _HttpError({"retry-after-ms": "1500"})) == 1.5
    assert policy.delay(2, _HttpError({"retry-after": "0.1"})) == 1.0  # never shorter than the backoff
    assert policy.delay(1, RateLimitError("slow down", retry_after=3600.0)) == 30  # bounded
    wrapped = RuntimeError("the LM call failed")
    wrapped.__cause__ = RateLimitError("slow down", retry_after=4.0)
    assert policy.delay(1, wrapped) == 4.0


def test_one_retry_layer_each_honouring_retry_after(monkeypatch):
    """An LM's rate limit is retried by the LM (num_retries) alone; a metric's own HTTP error is retried
    by AgentGrad. Both wait as long as the server asks."""
    from dspy.lm15 import RateLimitError

    slept, ours = [], []  # time.sleep calls (DSPy's); AgentGrad's waits
    monkeypatch.setattr(time, "sleep", slept.append)
    monkeypatch.setattr(RetryPolicy, "wait", lambda self, attempt, error=None: ours.append(self.delay(attempt, error)))

    class SlowDown(RuleEngine):
        def __init__(self, rule):
            super().__init__(rule)
            self.refused = False

        def complete(self, request):
            if not self.refused:
                self.refused = True
                raise RateLimitError("slow down", retry_after=2.5)
            return super().complete(request)

    class ServiceUnavailable(Exception):  # as an HTTP client raises it
        response = type("Response", (), {"headers": {"retry-after": "1.5"}})()

    refused = []

    def judged_remotely(gold, pred, trace=None, pred_name=None, pred_trace=None):
        if not refused:
            refused.append(True)
            raise ServiceUnavailable("503")
        return feedback_metric(gold, pred)

    dspy.configure(lm=fake_lm(SlowDown(World()), num_retries=1))
    result = compile_once(metric_fn=judged_remotely).detailed_results
    assert ours == [1.5] and slept == [2.5]  # AgentGrad waited 1.5 s for the metric, DSPy 2.5 s for its LM
    assert result.program_errors.get("retries", 0) == 0 and not result.program_errors.get("transient")


# ---- log_dir cost ---------------------------------------------------------------------------------------


def test_state_json_does_not_grow_with_the_rounds(tmp_path):
    sizes = []
    for rounds in (1, 4):
        dspy.configure(lm=world_lm(World()))
        train = make_data({"extract": 3, "notes": 3, "answer": 3, "none": 1})
        AgentGrad(
            feedback_metric,
            log_dir=tmp_path / str(rounds),
            config=AgentGradConfig.from_options(max_rounds=rounds, cluster_schedule=(1,), **FAST),
        ).compile(Pipeline(), trainset=train, valset=VAL)
        sizes.append((tmp_path / str(rounds) / "state.json").stat().st_size)
    assert sizes[1] < 1.3 * sizes[0]


def test_the_journal_is_synced_per_batch_not_per_record_and_stores_long_text_once(tmp_path, monkeypatch):
    import os

    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    dspy.configure(lm=world_lm(World()))
    padding = " and some words that make this question long enough to be stored once" * 2
    train = [
        dspy.Example(question=ex.question + padding, answer=ex.answer).with_inputs("question")
        for ex in make_data({"extract": 3, "notes": 3, "answer": 2})
    ]
    started = time.monotonic()
    compile_once(tmp_path, trainset=train, num_threads=4, max_rounds=2)
    elapsed = time.monotonic() - started
    lines = [json.loads(line) for line in (tmp_path / "memo.jsonl").read_text().splitlines()]
    records = [e for e in lines if "key" in e]
    assert len(records) > 30
    # run.json, state.json (start, 2 rounds), result.json, result.md, report.html, optimized_program.json, the lock
    # note (every file written atomically: synced), and the journal's closing sync
    files_written = 4 + 4 + 2
    assert len(synced) <= files_written + elapsed / 1.0 + 1  # at most one journal sync per second
    texts = [e["value"] for e in lines if "text" in e]
    assert texts and len(texts) == len(set(texts))  # each long text written once, referred to after
