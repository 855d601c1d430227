"""Demonstration candidates: pseudo-labels shown to the step they correct (``AgentGrad(candidates=...)``)."""

from __future__ import annotations

import json

import dspy
import pytest
from world import Pipeline, World, agentgrad, counted, feedback_metric, make_data, world_lm

from dspy_agentgrad import AgentGrad
from dspy_agentgrad.config import AgentGradConfig
from dspy_agentgrad.program.evaluation import state_key
from dspy_agentgrad.program.hint_delivery import hint_outputs
from dspy_agentgrad.program.program_state import ProgramState
from dspy_agentgrad.runtime.jsonable import digest

FAST = dict(auto=None, progress=False)


def data():
    train = make_data({"answer": 3, "notes": 2, "none": 1})
    val = make_data({"answer": 3, "notes": 2, "none": 3}, start=50)
    return train, val


def compile_in(world: World, candidates: str, **options):
    dspy.configure(lm=world_lm(world))
    train, val = data()
    optimizer = agentgrad(
        feedback_metric, candidates=candidates, max_rounds=2, cluster_schedule=(1,), **FAST, **options
    )
    return optimizer.compile(Pipeline(), trainset=train, valset=val)


def test_a_step_that_follows_demonstrations_is_repaired_by_demos_not_by_rewrites():
    rewritten = compile_in(World(learns_from="demos"), "instructions").detailed_results
    assert rewritten.candidates and not rewritten.accepted
    assert rewritten.best_val_score == rewritten.initial_val_score

    world = World(learns_from="demos")
    program = compile_in(world, "demos")
    result = program.detailed_results
    assert result.best_val_score == 1.0 > result.initial_val_score
    kept = {c.predictor for c in result.accepted}
    assert kept == {"answer", "notes"} and all(c.kind == "demos" for c in result.candidates)
    # the compiled program carries the demonstrations: the pseudo-labels' inputs and corrected outputs
    answer_demos = program.answer.demos
    assert answer_demos and all(
        d.answer.startswith("ans-id") and "notes" in d and "question" in d for d in answer_demos
    )
    assert result.final_instructions == result.initial_instructions  # demos alone: no instruction changed
    # demonstrations need no prompt LM: no gradient, no grouping, no rewrite
    assert result.usage["prompt"]["calls"] == 0
    assert world.calls["gradient"] == world.calls["rewrite"] == world.calls["abstract"] == 0
    dspy.configure(lm=world_lm(World(learns_from="demos")))
    scores = [feedback_metric(ex, program(**ex.inputs())).score for ex in data()[1]]
    assert scores == [1.0] * len(scores)


def test_both_keeps_the_kind_of_candidate_the_step_follows():
    result = compile_in(World(), "both").detailed_results  # this world's steps follow instructions only
    assert result.best_val_score == 1.0
    assert {c.kind for c in result.accepted} == {"instructions"}
    assert {c.kind for c in result.candidates} == {"instructions", "demos"}
    assert all("FIX-" in text for name, text in result.final_instructions.items() if name in ("answer", "notes"))

    result = compile_in(World(learns_from="demos"), "both").detailed_results
    assert result.best_val_score == 1.0 and {c.kind for c in result.accepted} == {"demos"}


def test_demonstrations_are_saved_and_loaded_with_the_program(tmp_path):
    program = compile_in(World(learns_from="demos"), "demos")
    path = tmp_path / "program.json"
    program.save(str(path))
    loaded = Pipeline()
    loaded.load(str(path))
    assert [dict(d) for d in loaded.answer.demos] == [d.toDict() for d in program.answer.demos]
    assert loaded.answer.demos


def test_the_users_own_demos_stay_first_and_the_users_program_is_not_changed():
    world = World(learns_from="demos")
    dspy.configure(lm=world_lm(world))
    student = Pipeline()
    own = dspy.Example(question="id999 kind=none", notes="nothing", answer="own-answer")
    student.answer.demos = [own]
    train, val = data()
    program = AgentGrad(
        feedback_metric,
        candidates="demos",
        config=AgentGradConfig.from_options(max_rounds=1, cluster_schedule=(1,), **FAST),
    ).compile(student, trainset=train, valset=val)
    assert student.answer.demos == [own]
    assert program.answer.demos[0] == own and len(program.answer.demos) > 1


def test_a_leaking_pseudo_label_never_becomes_a_demonstration():
    # notes is at fault but never follows its hint; the answerer copies the gold answer out of its hint,
    # a value its inputs do not hold: a leaking fix, attributed to answer as the fallback
    world = World(learns_from="demos", leaky_answer=True, hint_follow_rate=0.0)
    dspy.configure(lm=world_lm(world))
    examples = make_data({"notes": 3})
    report = AgentGrad(feedback_metric, config=AgentGradConfig.from_options(max_rounds=1, **FAST)).attribute(
        Pipeline(), examples
    )
    assert len(report.attributed["answer"]) == 3 and all(r.leaked for r in report.attributed["answer"])
    program = AgentGrad(
        feedback_metric,
        candidates="demos",
        config=AgentGradConfig.from_options(max_rounds=1, cluster_schedule=(1,), **FAST),
    ).compile(Pipeline(), trainset=examples, valset=make_data({"notes": 2}, start=50))
    assert program.answer.demos == [] and program.detailed_results.candidates == []


def test_at_most_max_demos_per_predictor():
    program = compile_in(World(learns_from="demos"), "demos", max_demos=1)
    assert len(program.answer.demos) == len(program.notes.demos) == 1


def test_a_demo_run_resumes_without_paying_again(tmp_path):
    train, val = data()
    results = []
    for _ in range(2):
        dspy.configure(lm=world_lm(World(learns_from="demos")))
        metric, calls = counted(feedback_metric)
        program = AgentGrad(
            metric,
            candidates="demos",
            log_dir=tmp_path,
            config=AgentGradConfig.from_options(max_rounds=2, cluster_schedule=(1,), **FAST),
        ).compile(Pipeline(), trainset=train, valset=val)
        results.append((program.detailed_results, len(calls)))
    (first, paid_first), (second, paid_again) = results
    assert paid_first > 0 and paid_again == 0
    assert second.resumed and second.final_demos == first.final_demos and second.candidates == first.candidates
    saved = json.loads((tmp_path / "result.json").read_text())
    assert saved["final_demos"] == first.final_demos


def test_a_program_without_demos_keys_as_before_so_old_journals_replay():
    instructions = {"answer": "Answer.", "notes": "Take notes."}
    assert state_key(instructions) == digest(instructions)  # the key journals were written under
    assert state_key(ProgramState(instructions)) == digest(instructions)
    with_demos = ProgramState(instructions).with_demos("answer", [{"notes": "n", "answer": "a"}])
    assert state_key(with_demos) != digest(instructions)
    assert with_demos.changed(ProgramState(instructions)) == {"answer"}


def test_switching_candidates_on_resume_is_refused(tmp_path):
    from dspy_agentgrad import RunMismatch

    compile_in(World(), "instructions", log_dir=tmp_path)
    with pytest.raises(RunMismatch, match="options"):
        compile_in(World(), "demos", log_dir=tmp_path)


@pytest.mark.parametrize("bad", [dict(candidates="examples"), dict(max_demos=0)])
def test_bad_demo_options_are_refused_with_the_choices(bad):
    with pytest.raises(ValueError, match="candidates must be one of|max_demos must be"):
        AgentGrad(feedback_metric, config=AgentGradConfig.from_options(max_rounds=1, **FAST, **bad))


def expected_output(example, pred_name, prediction, feedback):
    """A hint that is the output the step should write (what ``hint_delivery="demo"`` shows)."""
    qid = example.question.split()[0]
    return {"extract": qid, "notes": f"the answer is ans-{qid}", "answer": f"ans-{qid}"}[pred_name]


@pytest.mark.parametrize("delivery", ["input_field", "demo"])
def test_a_step_that_ignores_hints_but_copies_examples_is_attributed_when_the_hint_is_shown_as_one(delivery):
    world = World(learns_from="demos", hint_follow_rate=0.0)
    result = compile_in(world, "demos", hint_fn=expected_output, hint_delivery=delivery).detailed_results
    first = result.rounds[0]
    assert first.failures == 5
    if delivery == "input_field":  # the hint is ignored: every failure is a hard case and nothing is learned
        assert first.hard_cases == 5 and not any(first.attributed.values())
        assert result.best_val_score == result.initial_val_score
        return
    # shown its own inputs with the right output, the faulty step copies it: each failure goes to its step
    assert first.hard_cases == 0 and first.attributed == {"extract": 0, "notes": 2, "answer": 3}
    assert result.best_val_score == 1.0 > result.initial_val_score
    assert {c.predictor for c in result.accepted} == {"answer", "notes"}


def test_a_hint_shown_as_an_example_names_the_steps_outputs():
    one = dspy.Signature("question -> answer")
    assert hint_outputs(one, "Paris") == {"answer": "Paris"}
    assert hint_outputs(dspy.ChainOfThought(one).predict.signature, "Paris") == {"answer": "Paris"}  # not its reasoning
    two = dspy.Signature("question -> city, country")
    assert hint_outputs(two, '{"city": "Paris", "country": "France"}') == {"city": "Paris", "country": "France"}
    assert hint_outputs(two, "Paris") is None  # which field? the hint goes in the input field instead
    assert hint_outputs(two, '{"town": "Paris"}') is None
