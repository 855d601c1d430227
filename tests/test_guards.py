"""Guards against a run that would mislead or waste: option ranges, the log_dir lock, fail-fast on a setup
that cannot work, token reservations for every script, damaged files, numpy metric results."""

from __future__ import annotations

import dataclasses
import errno
import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import dspy
import numpy as np
import pytest
from world import Pipeline, World, agentgrad, feedback_metric, make_data, world_lm

from dspy_agentgrad import AgentGrad, FirstRunsFailed, LogDirBusy
from dspy_agentgrad.config import AgentGradConfig
from dspy_agentgrad.testing import FakeCall, RuleEngine, fake_lm

FAST = dict(auto=None, progress=False)
TRAIN = make_data({"extract": 2, "notes": 1, "answer": 1})
VAL = make_data({"extract": 1, "none": 1}, start=50)


def compile_once(log_dir=None, metric_fn=feedback_metric, program=None, **options):
    options = {"max_rounds": 1, **FAST, **options}
    return agentgrad(metric_fn, log_dir=log_dir, **options).compile(program or Pipeline(), trainset=TRAIN, valset=VAL)


# ---- every option range-checked -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "option, value",
    [
        ("failure_score", 2.0),  # above max_score=1: a failing metric would beat a correct run
        ("failure_score", 1.0),  # equal to max_score: a failed run would count as a success
        ("failure_score", math.nan),
        ("max_score", 0),  # with the default failure_score=0, a failed run would count as perfect
        ("max_score", math.nan),
        ("max_score", math.inf),
        ("max_score", True),
        ("fix_threshold", math.nan),
        ("max_prompt_cost", math.inf),
        ("max_prompt_cost", math.nan),
        ("max_instruction_chars", True),
        ("max_instruction_chars", 10),
        ("train_batch_size", True),
        ("retry_attempts", 0),
        ("num_threads", 0),
        ("seed", True),
        ("cluster_schedule", (True,)),
        ("cluster_schedule", (2, 0)),
        ("max_metric_calls", 0),
        ("max_prompt_tokens", 1.5),
    ],
)
def test_every_numeric_option_is_range_checked(option, value):
    budget = {} if option == "max_metric_calls" else {"max_rounds": 1}
    with pytest.raises(ValueError, match=option):
        AgentGrad(feedback_metric, config=AgentGradConfig.from_options(**{**FAST, **budget, option: value}))


@pytest.mark.parametrize("size", [0, -3, 2.5, True])
def test_the_estimate_sample_size_is_range_checked(size):
    with pytest.raises(ValueError, match="sample_size"):
        AgentGrad(feedback_metric, config=AgentGradConfig.from_options(max_rounds=1, **FAST)).estimate(
            Pipeline(), trainset=TRAIN, sample_size=size
        )


def test_failure_score_may_be_any_score_in_range():
    optimizer = AgentGrad(
        feedback_metric, config=AgentGradConfig.from_options(max_rounds=1, max_score=100, failure_score=50, **FAST)
    )
    assert optimizer.get_params()["failure_score"] == 50


# ---- a lock that a deleted lock file cannot defeat --------------------------------------------------


def test_deleting_the_lock_file_does_not_let_a_second_compile_in(tmp_path):
    dspy.configure(lm=world_lm(World()))
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time, dspy; from world import Pipeline, World, world_lm, feedback_metric, make_data\n"
            "from dspy_agentgrad import AgentGrad\n"
            "from dspy_agentgrad.config import AgentGradConfig\n"
            "class Slow(World):\n"
            "    def __call__(self, call):\n"
            "        print('running', flush=True); time.sleep(60)\n"
            "dspy.configure(lm=world_lm(Slow()))\n"
            "config = AgentGradConfig.from_options(auto=None, max_rounds=1, progress=False)\n"
            "AgentGrad(feedback_metric, log_dir=sys.argv[1], config=config).compile(\n"
            "    Pipeline(), trainset=make_data({'extract': 2, 'notes': 1, 'answer': 1}),\n"
            "    valset=make_data({'extract': 1, 'none': 1}, start=50))",
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parent,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), *sys.path])},
    )
    try:
        assert holder.stdout.readline().strip() == "running"  # the first compile holds the lock and runs
        for leftover in tmp_path.glob("lock*"):
            leftover.unlink()  # rm log_dir/lock
        with pytest.raises(LogDirBusy, match="in use by another compile"):
            compile_once(tmp_path)
    finally:
        holder.kill()
        holder.wait()
    assert compile_once(tmp_path).detailed_results.resumed  # a killed holder releases it


# ---- fail fast with the real cause ------------------------------------------------------------------


class Counting(World):
    def __init__(self, fail=None):
        super().__init__()
        self.fail = fail
        self.role_calls = 0

    def __call__(self, call: FakeCall):
        if "current_instruction" in call.inputs:
            self.role_calls += 1
        elif self.fail is not None:
            raise self.fail
        return super().__call__(call)


@pytest.mark.parametrize(
    "error, cause, fix",
    [
        (dspy.lm15.AuthError("Incorrect API key provided"), "LMAuthError on each .*Incorrect API key", "the API key"),
        (dspy.lm15.UnsupportedModelError("model gpt-9 does not exist"), "does not exist", "the model name"),
    ],
)
def test_an_lm_that_rejects_every_call_stops_the_run_naming_the_error(error, cause, fix):
    world = Counting(fail=error)
    dspy.configure(lm=world_lm(world))
    with pytest.raises(FirstRunsFailed, match=cause) as caught:
        compile_once()
    assert f"To fix: check {fix}" in str(caught.value) and "hints" not in str(caught.value)
    assert world.role_calls == 0  # stopped after the first validation pass, before paying the prompt LM


def test_a_metric_that_always_raises_stops_the_run_naming_its_error():
    world = Counting()
    dspy.configure(lm=world_lm(world))

    def broken(gold, pred, trace=None):
        return {"score": gold.missing_field}

    with pytest.raises(FirstRunsFailed, match=r"metric raised AttributeError.*missing_field") as caught:
        compile_once(metric_fn=broken)
    assert "Fix the metric" in str(caught.value)
    assert world.role_calls == 0


class Forgetful(Pipeline):
    def forward(self, question):
        super().forward(question)  # computes the answer, then forgets to return it


def test_a_forward_that_returns_none_stops_the_run_naming_the_fix():
    world = Counting()
    dspy.configure(lm=world_lm(world))
    with pytest.raises(FirstRunsFailed, match=r"forward\(\) returned None.*return") as caught:
        compile_once(program=Forgetful())
    assert "Forgetful" in str(caught.value) and world.role_calls == 0


# ---- token reservations are a bound for any script -----------------------------------------------


def _cl100k():
    """OpenAI's cl100k tokenizer from the files litellm ships (no download), or skip."""
    tiktoken = pytest.importorskip("tiktoken")
    spec = importlib.util.find_spec("litellm")
    files = Path(spec.submodule_search_locations[0]) / "litellm_core_utils" / "tokenizers" if spec else None
    if files is None or not files.is_dir():
        pytest.skip("litellm's bundled tokenizer files are not installed")
    os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(files))
    try:
        return tiktoken.get_encoding("cl100k_base")
    except Exception as exc:  # no network to download it
        pytest.skip(f"cl100k_base cannot be loaded offline: {exc}")


class TokenizedEngine(RuleEngine):
    """The world's replies, with usage counted by a real tokenizer."""

    def __init__(self, rule, encoding):
        super().__init__(rule)
        self.encoding = encoding

    def complete(self, request):
        response = super().complete(request)
        system = request.system if isinstance(request.system, str) else "".join(p.text for p in request.system or [])
        prompt = len(self.encoding.encode(system + "".join(m.text or "" for m in request.messages)))
        completion = len(self.encoding.encode(response.message.text))
        usage = dspy.lm15.Usage(input_tokens=prompt, output_tokens=completion, total_tokens=prompt + completion)
        return dataclasses.replace(response, usage=usage)


FILLERS = {"chinese": "北京的历史非常悠久，这个问题需要仔细阅读材料。" * 60, "emoji": "🤖🎉👍🏽🚀✨🧪" * 80}


@pytest.mark.parametrize("script", sorted(FILLERS))
def test_prompt_token_caps_hold_for_cjk_and_emoji_text(script):
    encoding = _cl100k()
    lm = fake_lm(TokenizedEngine(World(), encoding))
    lm.kwargs["max_tokens"] = 60  # bounds the world's short replies
    dspy.configure(lm=lm)
    filler = FILLERS[script]
    train = [e.copy(question=f"{e.question} {filler}") for e in make_data({"extract": 3, "notes": 3, "answer": 3})]
    val = [e.copy(question=f"{e.question} {filler}") for e in make_data({"extract": 2, "none": 2}, start=50)]
    for cap in (6000, 15000, 30000):
        result = (
            AgentGrad(
                feedback_metric,
                config=AgentGradConfig.from_options(max_rounds=3, cluster_schedule=(1,), max_prompt_tokens=cap, **FAST),
            )
            .compile(Pipeline(), trainset=train, valset=val)
            .detailed_results
        )
        paid = result.usage["prompt"]["prompt_tokens"] + result.usage["prompt"]["completion_tokens"]
        assert paid <= cap, f"{script}: {paid} tokens paid under max_prompt_tokens={cap}"


# ---- damaged files and atomic writes -------------------------------------------------------------------


def test_report_on_a_damaged_result_json_names_the_file_and_what_to_do(tmp_path):
    dspy.configure(lm=world_lm(World()))
    compile_once(tmp_path)
    result = tmp_path / "result.json"
    result.write_text(result.read_text()[:200])
    ran = subprocess.run(
        [sys.executable, "-m", "dspy_agentgrad", "report", str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert ran.returncode != 0 and "Traceback" not in ran.stderr
    assert str(result) in ran.stderr and "compile again with the same log_dir" in ran.stderr


def test_a_full_disk_leaves_no_temp_file_and_the_old_state_intact(tmp_path, monkeypatch):
    from dspy_agentgrad.runtime.atomic_files import atomic_write_json

    path = tmp_path / "state.json"
    atomic_write_json(path, {"round": 1})

    def disk_full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(OSError, match="No space left"):
        atomic_write_json(path, {"round": 2})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]
    assert json.loads(path.read_text()) == {"round": 1}


# ---- numpy metric results ---------------------------------------------------------------------------------


def test_a_metric_returning_numpy_bool_is_a_score():
    dspy.configure(lm=world_lm(World()))

    def numpy_metric(gold, pred, trace=None):
        return np.bool_(getattr(pred, "answer", None) == gold.answer)

    result = compile_once(metric_fn=numpy_metric).detailed_results
    assert result.initial_val_score == 0.5  # the "none" example right, the "extract" one wrong


def test_a_prompt_lm_that_rejects_its_first_call_stops_the_run_naming_the_error():
    dspy.configure(lm=world_lm(World()))

    def rejected(call: FakeCall):
        raise dspy.lm15.AuthError("Incorrect API key provided")

    with pytest.raises(FirstRunsFailed, match=r"prompt LM failed with LMAuthError.*Incorrect API key") as caught:
        compile_once(prompt_model=fake_lm(rejected))
    assert "To fix: check the API key" in str(caught.value)


def test_the_lm_requests_of_an_instruction_proposer_are_reserved_against_the_prompt_token_cap():
    """A custom proposer that calls its own LM three times per rewrite, with a long prompt each time: every
    request is reserved before it is sent, so the cap holds and stops the run, whatever the proposer does."""
    lm = world_lm(World())
    lm.kwargs["max_tokens"] = 60  # bounds the world's short replies
    dspy.configure(lm=lm)
    helper = fake_lm(lambda call: "Add the missing fix.", name="fake/proposer-helper")
    helper.kwargs["max_tokens"] = 60
    asked: list[int] = []

    def proposer(request):
        for _ in range(3):
            helper("context " * 3000 + request.current_instruction)
            asked.append(1)
        return f"{request.current_instruction} FIX-{request.predictor}."

    def swallowing(request):  # a proposer that catches every error must not lift the cap either
        try:
            return proposer(request)
        except Exception:
            return None

    train = make_data({"extract": 3, "notes": 3, "answer": 3})
    val = make_data({"extract": 2, "notes": 1, "none": 2}, start=50)
    for chosen in (proposer, swallowing):
        for cap in (20000, 30000):
            asked.clear()
            result = (
                AgentGrad(
                    feedback_metric,
                    instruction_proposer=chosen,
                    config=AgentGradConfig.from_options(
                        max_rounds=3, cluster_schedule=(1,), max_prompt_tokens=cap, **FAST
                    ),
                )
                .compile(Pipeline(), trainset=train, valset=val)
                .detailed_results
            )
            paid = result.usage["prompt"]["prompt_tokens"] + result.usage["prompt"]["completion_tokens"]
            assert paid <= cap, f"{chosen.__name__}: {paid} tokens paid under max_prompt_tokens={cap}"
            assert asked, "the proposer was never asked: the test shows nothing"
            assert "prompt-LM token budget" in result.stop_reason, result.stop_reason
