"""IFBench: data, offline verifiers (IFBench + IFEval ids), metric, hint, two-stage program."""

import importlib.util
import json
import subprocess
import sys

import dspy
import pytest

from benchmarks import load_benchmark
from benchmarks.common import REPO_ROOT, data_file
from benchmarks.ifbench import IFBenchTwoStage, constraint_fraction, hint, read_examples
from benchmarks.ifbench.verifiers import check_constraints, registry_for
from dspy_agentgrad.testing import fake_lm

# the [bench] extra: skipped cleanly when it is not installed
pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("nltk", "if_verifiable")),
    reason="the [bench] extra or the verifiers (pip install --no-deps if-verifiable==0.1.2) are not installed",
)


def _ex(suite, ids, kwargs, query="Write something."):
    return dspy.Example(query=query, instruction_id_list=ids, kwargs=kwargs, suite=suite).with_inputs("query")


def test_splits_and_sizes():
    bench = load_benchmark("ifbench", train=20, val=30, seed=0)
    assert bench.info["sizes"] == {"train": 20, "val": 30, "test": 294}
    assert {e.suite for e in bench.trainset + bench.valset} == {"ifeval"}
    assert {e.suite for e in bench.testset} == {"ifbench"}
    keys = [e.key for e in bench.trainset + bench.valset]
    assert len(keys) == len(set(keys))
    assert all(None not in kw.values() for e in bench.testset for kw in e.kwargs)
    with pytest.raises(ValueError, match="294"):
        load_benchmark("ifbench", train=5, val=5, test=300)


def test_every_constraint_id_in_the_data_has_a_verifier():
    bench_ids = {
        i for e in read_examples(data_file("ifbench", "IFBench_test.jsonl"), "ifbench") for i in e.instruction_id_list
    }
    eval_ids = {
        i for e in read_examples(data_file("ifeval", "input_data.jsonl"), "ifeval") for i in e.instruction_id_list
    }
    assert bench_ids <= set(registry_for("ifbench"))
    assert eval_ids <= set(registry_for("ifeval"))
    assert len(eval_ids - set(registry_for("ifbench"))) > 0  # why the IFEval verifier set is needed too


def test_verifiers_need_neither_downloads_nor_the_heavy_packages():
    """In a fresh interpreter where importing datasets, spaCy or LangChain fails and nltk.download
    raises, both verifier sets still load and score (they are installed with --no-deps)."""
    code = (
        "import sys, nltk\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('datasets', 'spacy', 'langchain', 'pyarrow', 'pandas'):\n"
        "            raise ImportError('blocked: ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "def boom(*a, **k): raise SystemExit('download attempted: %r' % (a,))\n"
        "nltk.download = boom\n"
        "from benchmarks.ifbench.verifiers import check_constraints\n"
        "r = check_constraints('ifbench', ['count:word_count_range'], [{'min_words': 1, 'max_words': 50}],\n"
        "                      'p', 'Hello there. Two sentences here.')\n"
        "r2 = check_constraints('ifeval', ['length_constraints:number_sentences'],\n"
        "                       [{'relation': 'less than', 'num_sentences': 3}], 'p', 'One. Two.')\n"
        "assert r[0].followed and r[0].error is None, r\n"
        "assert r2[0].followed and r2[0].error is None, r2\n"
        "print('OK')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "OK" in out.stdout, out.stdout + out.stderr


def test_every_ifbench_test_prompt_goes_through_its_verifiers():
    """All 294 IFBench test rows are checked (each prompt answered with itself and with a reply built
    from its own keyword arguments). Only the upstream format:quote_unquote verifier ever raises (an
    IndexError on some texts), and that counts as not followed; both verdicts occur."""
    rows = [json.loads(line) for line in data_file("ifbench", "IFBench_test.jsonl").read_text().splitlines()]
    results = []
    for row in rows:
        words = " ".join(str(v) for kw in row["kwargs"] for v in (kw or {}).values() if isinstance(v, (str, int)))
        for response in (row["prompt"], f"{words}. {words}!\n* {words}?"):
            results += check_constraints("ifbench", row["instruction_id_list"], row["kwargs"], row["prompt"], response)
    assert len(rows) == 294 and len(results) == 670
    assert {r.instruction_id for r in results if r.error} <= {"format:quote_unquote"}
    assert all(not r.followed for r in results if r.error)
    assert 0 < sum(r.followed for r in results) < len(results)


def test_ifeval_constraints_scored_loose():
    no_comma = ["punctuation:no_comma"]
    assert check_constraints("ifeval", no_comma, [{}], "p", "No commas here.")[0].followed
    assert not check_constraints("ifeval", no_comma, [{}], "p", "Yes, a comma.")[0].followed
    lower = ["change_case:english_lowercase"]
    # Loose variant: a first line (e.g. a title) is dropped before checking.
    assert check_constraints("ifeval", lower, [{}], "p", "TITLE LINE\nall lower case here")[0].followed
    assert not check_constraints("ifeval", lower, [{}], "p", "Mixed Case\nAnd More Mixed\nStill Mixed")[0].followed


def test_metric_fraction_and_feedback():
    gold = _ex("ifeval", ["punctuation:no_comma", "keywords:existence"], [{}, {"keywords": ["zebra"]}])
    half = constraint_fraction(gold, dspy.Prediction(response="A plain sentence without that animal."))
    assert half.score == pytest.approx(0.5)
    assert "Followed:\n- punctuation:no_comma" in half.feedback
    assert "Violated:\n- keywords:existence" in half.feedback and "zebra" in half.feedback
    full = constraint_fraction(gold, dspy.Prediction(response="A zebra sentence."))
    assert full.score == 1.0 and "Violated" not in full.feedback
    assert constraint_fraction(gold, dspy.Prediction(response="")).score == 0.0
    text = hint(gold, "enforce_constraints.predict", dspy.Prediction(response="no animal here"), half.feedback)
    target, per_module = text.split("\n", 2)[:2], text.split("\n", 2)[2]
    assert "zebra" in target[1] and "comma" not in target[1].lower()  # the fix names only the violated one
    assert per_module.startswith("Your final response satisfies 1 of 2")  # then the stage's own feedback
    assert hint(gold, "respond.predict", dspy.Prediction(response="A zebra."), "") is None


def test_each_stage_gets_feedback_on_its_own_output():
    gold = _ex("ifeval", ["keywords:existence"], [{"keywords": ["zebra"]}])
    pred = dspy.Prediction(draft="A zebra grazes.", response="It grazes.")
    first = constraint_fraction(gold, pred, None, "respond.predict", None)
    second = constraint_fraction(gold, pred, None, "enforce_constraints.predict", None)
    assert first.score == second.score == 0.0  # the score is always the final response's
    assert first.feedback.startswith("Your draft response satisfies 1 of 1")
    assert second.feedback.startswith("Your final response satisfies 0 of 1")


def test_ifbench_test_constraint():
    row = json.loads(data_file("ifbench", "IFBench_test.jsonl").read_text().splitlines()[0])
    gold = _ex("ifbench", row["instruction_id_list"], row["kwargs"], row["prompt"])
    words = "kaleidoscope " + "nebula " * 2 + "whisper " * 3 + "labyrinth " * 5 + "paradox " * 7
    assert constraint_fraction(gold, dspy.Prediction(response=words)).score == 1.0
    assert constraint_fraction(gold, dspy.Prediction(response="kaleidoscope")).score == 0.0


def test_two_stage_program_returns_rewritten_response():
    def rule(call):
        if "final_response" in call.output_fields:
            return {"reasoning": "r", "final_response": call.inputs["response"].upper()}
        return {"reasoning": "r", "response": "draft text"}

    program = IFBenchTwoStage()
    assert [n for n, _ in program.named_predictors()] == ["respond.predict", "enforce_constraints.predict"]
    with dspy.context(lm=fake_lm(rule)):
        pred = program(query="Answer in capitals.")
    assert pred.draft == "draft text" and pred.response == "DRAFT TEXT"
    gold = _ex("ifeval", ["change_case:english_capital"], [{}])
    assert constraint_fraction(gold, pred).score == 1.0
