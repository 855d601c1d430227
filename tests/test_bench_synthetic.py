"""The synthetic benchmark: seeded data, the task side's defects, and one prompt rule for every optimizer."""

from __future__ import annotations

import json

import dspy

from benchmarks.lms import synthetic_lm
from benchmarks.synthetic import load_benchmark
from benchmarks.synthetic.world import SyntheticWorld, decode_ticket, fix_phrase
from dspy_agentgrad.testing import FakeCall

STEP1 = "Given the fields `question`, `note0`, produce the fields `note1`."


def call(inputs: dict, fields: list[str], user: str = "") -> FakeCall:
    return FakeCall("", user, "", inputs, fields)


def test_data_are_seeded_and_hold_every_kind_of_example():
    a, b, c = (load_benchmark(train=60, val=60, test=10, seed=s) for s in (0, 0, 1))
    assert [e.question for e in a.valset] == [e.question for e in b.valset]
    assert [e.question for e in a.valset] != [e.question for e in c.valset]
    profile = a.info["val_profile"]
    assert profile["clean"] > 0 and profile["multi_step_faults"] > 0 and profile["unfixable"] > 0
    assert len(profile["defects"]) >= 4


def test_a_fix_phrase_repairs_the_examples_of_its_defect_and_nothing_else():
    bench = load_benchmark(train=10, val=80, test=10, seed=0)
    lm = synthetic_lm("synthetic:0,0")
    target = max(bench.info["val_profile"]["defects"], key=bench.info["val_profile"]["defects"].get)
    field = target.rsplit("-", 1)[0]
    program = bench.make_program()
    step = next(p for p in program.named_predictors() if field in p[1].signature.output_fields)[1]

    def correct():
        with dspy.context(lm=lm):
            return [bench.metric(ex, program(question=ex.question)).score == 1.0 for ex in bench.valset]

    before = correct()
    step.signature = step.signature.with_instructions(step.signature.instructions + " " + fix_phrase(target))
    after = correct()
    assert sum(after) > sum(before)
    assert all(a or not b for a, b in zip(after, before))  # nothing that passed breaks
    for ex, ok in zip(bench.valset, after):
        _case, bits, unfixable = decode_ticket(ex.question)
        if unfixable:
            assert not ok


def test_the_prompt_rule_proposes_the_same_fix_in_every_optimizers_format():
    world = SyntheticWorld(0, 0)
    shown = 'Generated Outputs: {"note1": "key=? (SYM-note1-b)"}; upstream: SYM-note0-a'
    gepa = json.loads(
        world.prompt(call({"current_instruction": STEP1, "examples_with_feedback": shown}, ["new_instruction"]))
    )["new_instruction"]
    gepa_raw = world.prompt(
        call({}, [], user=f"I provided an assistant with the following instructions\n```\n{STEP1}\n```\n{shown}")
    )
    agentgrad = world.prompt(
        call(
            {"current_instruction": STEP1, "feedback": "advice", "examples": shown, "rejected_rewrites": "(none)"},
            ["new_instruction"],
        )
    )["new_instruction"]
    expected = f"{STEP1} {fix_phrase('note1-b')}"
    assert gepa == agentgrad == expected and gepa_raw.strip("`\n") == expected  # note0's symptom is not note1's


def test_no_symptom_means_no_new_fix_even_when_fix_phrases_are_shown():
    world = SyntheticWorld(0, 0)
    rejected = f"[0] {STEP1} {fix_phrase('note1-a')}"
    out = world.prompt(
        call(
            {"current_instruction": STEP1, "feedback": "be careful", "examples": "", "rejected_rewrites": rejected},
            ["new_instruction"],
        )
    )
    assert out == {"new_instruction": STEP1}
    gradient = world.prompt(call({"current_instruction": STEP1, "original_output": "key=k12345"}, ["gradient"]))
    assert "RULE-" not in gradient["gradient"]


def test_aggregator_merges_small_groups_only_when_told_a_minimum():
    world = SyntheticWorld(0, 0)
    grads = "[0] saw SYM-note1-a\n[1] saw SYM-note1-b\n[2] saw SYM-note1-a"
    base = {"current_instruction": STEP1, "gradients": grads}
    assert len(world.prompt(call({**base, "min_cluster_size": "1"}, ["clusters"]))["clusters"]) == 2
    merged = world.prompt(call({**base, "min_cluster_size": "3"}, ["clusters"]))["clusters"]
    assert [sorted(c["members"]) for c in merged] == [[0, 1, 2]]
    assert "RULE-note1-a" in merged[0]["generalized_gradient"] and "RULE-note1-b" in merged[0]["generalized_gradient"]


def test_a_demonstration_of_a_correct_output_on_a_case_with_the_defect_repairs_half_the_cases():
    world = SyntheticWorld(0, 0)
    bench = load_benchmark(train=10, val=200, test=10, seed=0)
    profile = bench.info["val_profile"]["defects"]
    target = max((d for d in profile if d.startswith("note0")), key=profile.get)
    carriers = [
        ex
        for ex in bench.valset
        if any(f"note0-{'ab'[b % 2]}" == target for b in decode_ticket(ex.question)[1] if b < 2)
    ]
    teacher, cases = carriers[0], carriers[1:]
    good = {"question": teacher.question, "note0": "key=k00000 (checked at step 0)"}
    broken = {"question": teacher.question, "note0": f"key=? (SYM-{target})"}

    def repaired(demos):
        outputs = [world.task(FakeCall("", "", "", {"question": ex.question}, ["note0"], demos)) for ex in cases]
        return sum("SYM-" not in out["note0"] for out in outputs)

    alone = repaired([])
    assert alone < repaired([good]) < len(cases)  # some, not all: a demonstration teaches by analogy
    assert repaired([broken]) == alone  # a demonstration of the broken output teaches nothing
