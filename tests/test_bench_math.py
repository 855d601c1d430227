"""MATH: math-verify's notion of a right answer, the solve -> verify program's feedback, the offline
fixture run and the online loader's clear error without network."""

from __future__ import annotations

import importlib.util
import json

import dspy
import pytest

from benchmarks import run

pytestmark = pytest.mark.skipif(importlib.util.find_spec("math_verify") is None, reason="the [math] extra is missing")


@pytest.fixture(autouse=True)
def _restore_dspy_cache():
    saved = dspy.cache
    yield
    dspy.cache = saved


@pytest.mark.parametrize(
    ("gold", "predicted", "same"),
    [
        ("\\frac{2}{3}", "2/3", True),
        ("5\\sqrt{2}", "\\sqrt{50}", True),
        ("x+3", "3 + x", True),
        ("9\\pi", "$9\\pi$", True),
        ("391", "392", False),
        ("\\frac{1}{4}", "0.3", False),
        ("6", "", False),
    ],
)
def test_answers_are_compared_as_mathematical_objects(gold, predicted, same):
    from benchmarks.math import answers_match

    assert answers_match(gold, predicted) is same


def test_verifier_feedback_says_when_it_spoiled_a_right_draft():
    from benchmarks.math import math_metric

    gold = dspy.Example(problem="p", answer="13", solution="f(1) = 5 and f(5) = 13.").with_inputs("problem")
    pred = dspy.Prediction(solution="...", draft_answer="13", answer="12")
    verify = math_metric(gold, pred, pred_name="verify.predict")
    solve = math_metric(gold, pred, pred_name="solve")
    assert verify.score == 0.0 and "was right, but the verifier changed it to '12'" in verify.feedback
    assert "draft answer '13' is right" in solve.feedback
    assert "Reference solution: f(1) = 5" in math_metric(gold, pred).feedback


def test_math_dry_run_on_the_offline_fixture(tmp_path):
    out = tmp_path / "math"
    args = ["--bench", "math", "--task-lm", "fake", "--prompt-lm", "fake", "--max-metric-calls", "40"]
    args += ["--train", "6", "--val", "6", "--test", "6", "--num-threads", "2", "--optimizers", "agentgrad"]
    assert run.main([*args, "--out", str(out)]) == 0
    block = json.loads((out / "results.json").read_text())["benchmarks"]["math"]
    assert "fixture" in block["info"]["source"]
    entries = block["optimizers"]
    assert set(entries["agentgrad"]["instructions"]) == {"solve", "verify.predict"}
    assert entries["agentgrad"]["gain"] > 0  # the fake world's faults are fixable, and AgentGrad fixes them
    assert "| MATH |" in (out / "results.md").read_text()


def test_fixture_too_small_for_the_sizes_says_what_to_do(tmp_path, capsys):
    args = ["--bench", "math", "--task-lm", "fake", "--optimizers", "baseline", "--out", str(tmp_path)]
    assert run.main(args) == 2  # the default sizes (150/300/300) do not fit 30 problems
    err = capsys.readouterr().err
    assert "pass smaller --train/--val/--test or --source online" in err


def test_math500_online_without_network_is_a_clear_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("AGENTGRAD_CACHE_DIR", str(tmp_path / "cache"))

    def no_network(*args, **kwargs):
        raise OSError("[Errno -2] Name or service not known")

    monkeypatch.setattr("urllib.request.urlopen", no_network)
    args = ["--bench", "math", "--source", "online", "--task-lm", "fake", "--optimizers", "baseline"]
    assert run.main([*args, "--test", "5", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "could not download MATH-500" in err and "--source offline" in err and "Traceback" not in err
