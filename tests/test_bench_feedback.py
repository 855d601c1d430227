"""Per-module feedback: GEPA's reflection and AgentGrad's hints see the same module-specific text.

End to end on PUPA's fake world (no extra packages), by recording what the LMs are sent; unit-level for
HotpotQA, HoVer and IFBench's feedback builders."""

from __future__ import annotations

import threading

import dspy
import pytest

from benchmarks import load_benchmark
from benchmarks.fake_world import BenchWorld
from benchmarks.harness import run_optimizer
from benchmarks.hotpotqa.data import read_rows, to_example
from benchmarks.hotpotqa.metric import answer_exact_match
from benchmarks.hotpotqa.metric import hint as hotpot_hint
from benchmarks.hover.metric import discrete_retrieval
from benchmarks.hover.metric import hint as hover_hint
from dspy_agentgrad.testing import fake_lm

REDACTOR = "request sent to the untrusted external LLM"
RESPONDER = "You write the final response"


@pytest.fixture(autouse=True)
def _restore_dspy_cache():
    saved = dspy.cache
    yield
    dspy.cache = saved


class Recorder:
    """A fake-LM rule that records every call before the world answers it."""

    def __init__(self, world):
        self.world, self.calls, self._lock = world, [], threading.Lock()

    def __call__(self, call):
        with self._lock:
            self.calls.append(call)
        return self.world(call)


def _pupa_run(name, tmp_path):
    bench = load_benchmark("pupa", train=6, val=6, test=6, seed=0)
    world = BenchWorld(bench.trainset + bench.valset + bench.testset)
    task, prompt = Recorder(world), Recorder(world)
    bench.bind_lms({"judge": fake_lm(world), "untrusted": fake_lm(world)})
    run_optimizer(
        name,
        bench.make_program(),
        bench.trainset,
        bench.valset,
        bench.metric,
        task_lm=fake_lm(task),
        prompt_lm=fake_lm(prompt),
        max_metric_calls=40,
        num_threads=2,
        hint_fn=bench.hint,
        log_dir=tmp_path / name,
        cache_dir="off",
    )
    return task, prompt


def test_gepa_reflection_reads_each_modules_own_feedback(tmp_path):
    _task, prompt = _pupa_run("gepa", tmp_path)
    reflections = [c for c in prompt.calls if "examples_with_feedback" in c.inputs]
    assert reflections, "GEPA never reflected"
    for call in reflections:
        text, instruction = call.inputs["examples_with_feedback"], call.inputs["current_instruction"]
        if "private information" in instruction:  # the redactor's instruction
            assert REDACTOR in text and RESPONDER not in text
        else:
            assert RESPONDER in text and REDACTOR not in text


def test_agentgrad_hints_carry_the_same_module_feedback(tmp_path):
    task, _prompt = _pupa_run("agentgrad", tmp_path)
    hinted = [c for c in task.calls if c.hint]
    assert hinted, "AgentGrad never intervened"
    for call in hinted:
        expected = REDACTOR if "llm_request" in call.output_fields else RESPONDER
        assert expected in call.hint


def test_hotpotqa_modules_get_the_artifacts_feedback_and_hints_repeat_it():
    row = read_rows()[0]
    ex = to_example(row)
    first, second = ex.gold_titles
    pred = dspy.Prediction(answer="wrong", hop1_titles=[first], hop2_titles=["Other"])
    by_module = {
        name: answer_exact_match(ex, pred, None, f"{name}.predict", None).feedback
        for name in ("summarize1", "create_query_hop2", "summarize2", "final_answer")
    }
    assert len(set(by_module.values())) == 4
    assert f"still missing: {second}" in by_module["create_query_hop2"]
    support = row["context"]["sentences"][row["context"]["title"].index(second)]
    assert "".join(support).strip() in by_module["create_query_hop2"]  # the missing document's text
    sentence = support[row["supporting_facts"]["sent_id"][1]].strip()
    assert sentence in by_module["summarize1"] and sentence in by_module["summarize2"]  # the ideal summary
    assert f"the correct answer is '{ex.answer}'" in by_module["final_answer"]
    for name, feedback in by_module.items():
        assert feedback in hotpot_hint(ex, f"{name}.predict", pred, "")


def test_hover_modules_hear_what_their_hop_found_and_missed():
    ex = dspy.Example(claim="c", titles=["A", "B", "C"]).with_inputs("claim")
    pred = dspy.Prediction(hop_titles=[["A"], ["B"], ["X"]], retrieved_titles=["A", "B", "X"])
    query2 = discrete_retrieval(ex, pred, None, "create_query_hop2.predict", None).feedback
    query3 = discrete_retrieval(ex, pred, None, "create_query_hop3.predict", None).feedback
    assert "helped retrieve: B" in query2 and "Still missing after your query: C" in query2
    assert "helped retrieve" not in query3 and "Still missing after your query: C" in query3
    assert query3.split("\n", 1)[1] in hover_hint(ex, "create_query_hop3.predict", pred, "")
