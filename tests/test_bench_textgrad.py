"""TextGrad as an optimizer of the runner: feedback flows back along the program's steps through
TextGrad's own backward pass, the budget holds, and its row lands in results.json."""

from __future__ import annotations

import importlib.util
import json

import dspy
import pytest

from benchmarks import harness, run

needs_textgrad = pytest.mark.skipif(
    importlib.util.find_spec("textgrad") is None, reason="the [textgrad] extra is missing"
)
needs_math = pytest.mark.skipif(importlib.util.find_spec("math_verify") is None, reason="the [math] extra is missing")


@pytest.fixture(autouse=True)
def _restore_dspy_cache():
    saved = dspy.cache
    yield
    dspy.cache = saved


@needs_textgrad
def test_links_follow_the_values_a_step_consumed():
    from benchmarks.tgd.graph import StepCall, links

    steps = [
        StepCall("first", {"q": "question"}, {"note": "alpha beta"}),
        StepCall("second", {"q": "question", "note": "we read: alpha beta"}, {"query": "gamma delta"}),
        StepCall("third", {"q": "question", "passages": "retrieved text"}, {"answer": "epsilon"}),
    ]
    feeds, final = links(steps, {"answer": "epsilon"})
    assert feeds[1] == [0]  # its input holds the first step's output
    assert feeds[2] == [1]  # the query fed retrieval, which the trace does not show: linked to the next step
    assert final == [2]


class RecordingEngine:
    """A TextGrad engine that records every prompt and answers with a fixed text."""

    def __init__(self):
        self.prompts: list[tuple[str, str]] = []

    def __call__(self, prompt, system_prompt=None, **kwargs):
        self.prompts.append((system_prompt or "", prompt))
        return "Be more careful."


@needs_textgrad
def test_feedback_reaches_the_first_step_through_the_second():
    from benchmarks.tgd.engine import tg  # first: it sends textgrad's import-time log file out of the cwd
    from benchmarks.tgd.graph import StepCall, loss_of

    instructions = {
        name: tg.Variable(f"instruction of {name}", requires_grad=True, role_description=f"the `{name}` instruction")
        for name in ("solve", "verify")
    }
    steps = [
        StepCall("solve", {"problem": "1+1"}, {"draft_answer": "three"}),
        StepCall("verify", {"problem": "1+1", "draft_answer": "three"}, {"answer": "three!"}),
    ]
    engine = RecordingEngine()
    loss = loss_of(steps, {"answer": "three!"}, "2", "score: 0.0", instructions, engine)
    loss.backward(engine)
    assert all(var.get_gradient_text() for var in instructions.values())
    to_solve = [p for _s, p in engine.prompts if "<ROLE> the `solve` instruction </ROLE>" in p]
    # the solve instruction's feedback is asked for in the light of the feedback on its output (chain rule)
    assert to_solve and all("part of a larger system" in p for p in to_solve)
    assert any("score: 0.0" in p for _s, p in engine.prompts)  # the metric's evaluation is the loss


@needs_textgrad
@needs_math
def test_textgrad_row_lands_in_results_json_within_budget(tmp_path):
    out = tmp_path / "tg"
    args = ["--bench", "math", "--task-lm", "fake", "--prompt-lm", "fake", "--max-metric-calls", "40"]
    args += ["--train", "6", "--val", "6", "--test", "6", "--optimizers", "textgrad", "--out", str(out)]
    assert run.main(args) == 0
    entry = json.loads((out / "results.json").read_text())["benchmarks"]["math"]["optimizers"]["textgrad"]
    assert entry["status"] == "done" and entry["within_budget"] and entry["metric_calls"] <= 40
    assert entry["details"]["steps"] >= 1 and entry["usage"]["prompt"]["calls"] > 0
    assert entry["gain"] > 0  # the fake world's fix tokens reach the instructions through TGD
    assert any("FIX-" in text for text in entry["instructions"].values())
    assert "| TextGrad |" in (out / "results.md").read_text()


def test_without_textgrad_the_error_says_what_to_install(monkeypatch):
    import sys

    for name in [m for m in sys.modules if m == "textgrad" or m.startswith(("textgrad.", "benchmarks.tgd"))]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "textgrad", None)  # import textgrad -> ImportError
    lm = dspy.LM("fake/none")
    ex = [dspy.Example(q="1").with_inputs("q")]
    with pytest.raises(RuntimeError, match=r"pip install 'dspy-agentgrad\[textgrad\]'"):
        harness.run_optimizer(
            "textgrad",
            dspy.Predict("q -> a"),
            ex,
            ex,
            lambda g, p, t=None: 0.0,
            task_lm=lm,
            prompt_lm=lm,
            max_metric_calls=10,
            cache_dir="off",
        )


class Broken(dspy.Module):
    def __init__(self):
        super().__init__()
        self.step = dspy.Predict("q -> a")

    def forward(self, q):
        raise RuntimeError("always fails")


@needs_textgrad
def test_a_program_that_always_raises_still_ends_within_budget():
    from dspy_agentgrad.testing import fake_lm

    lm = fake_lm(lambda call: {"a": "x"})
    ex = [dspy.Example(q=str(i), a="y").with_inputs("q") for i in range(3)]
    result = harness.run_optimizer(
        "textgrad", Broken(), ex, ex[:1], lambda g, p, t=None: 0.0, task_lm=lm, prompt_lm=lm,
        max_metric_calls=10, cache_dir="off",
    )  # fmt: skip
    assert result.details["failed_runs"] > 0 and result.details["steps"] <= 10
