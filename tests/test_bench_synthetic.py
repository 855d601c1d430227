"""The synthetic benchmark: seeded data, the task side's defects, and one prompt rule for every optimizer."""

from __future__ import annotations

import json

import dspy

from benchmarks.lms import synthetic_lm
from benchmarks.synthetic import load_benchmark
from benchmarks.synthetic.world import SyntheticWorld, decode_ticket, fix_phrase
from dspy_agentgrad.testing import FakeCall
from dspy_agentgrad.testing.fake_lm import HINT_FIELD

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


def test_an_overreaching_fix_repairs_its_defect_and_breaks_some_examples_it_is_not_about(monkeypatch):
    monkeypatch.setenv("SYNTH_OVERREACH", "0.5")
    bench = load_benchmark(train=10, val=120, test=10, seed=0, n_steps=3)
    lm = synthetic_lm("synthetic:0,0")
    assert SyntheticWorld(0, 0, overreach=0.5).overreaches("note0-b")  # the defect this test fixes
    program = bench.make_program()
    step = program.named_predictors()[0][1]

    def correct():
        with dspy.context(lm=lm):
            return [bench.metric(ex, program(question=ex.question)).score == 1.0 for ex in bench.valset]

    def carries(ex) -> bool:
        _case, bits, _ = decode_ticket(ex.question)
        return 1 in bits  # step 0's second defect: note0-b

    before = correct()
    step.signature = step.signature.with_instructions(step.signature.instructions + " " + fix_phrase("note0-b"))
    after = correct()
    fixed = [a and not b for a, b in zip(after, before)]
    broken = [b and not a for a, b in zip(after, before)]
    assert any(fixed) and all(carries(ex) for ex, f in zip(bench.valset, fixed) if f)
    assert any(broken) and not any(carries(ex) for ex, b in zip(bench.valset, broken) if b)
    monkeypatch.setenv("SYNTH_OVERREACH", "0")
    lm = synthetic_lm("synthetic:0,0")
    assert all(a or not b for a, b in zip(correct(), before))  # without overreach nothing that passed breaks


def test_a_share_outside_0_to_1_is_refused(monkeypatch):
    from benchmarks.synthetic import hint_rate, overreach_share

    for name, read in (("SYNTH_OVERREACH", overreach_share), ("SYNTH_HINT_RATE", hint_rate)):
        for bad in ("1.5", "-0.1", "half"):
            monkeypatch.setenv(name, bad)
            try:
                read()
            except ValueError as error:
                assert name in str(error)
            else:
                raise AssertionError(f"{name}={bad!r} was accepted")


def test_the_hint_rate_sets_how_many_hinted_faulty_steps_follow_their_hint(monkeypatch):
    bench = load_benchmark(train=10, val=200, test=10, seed=0, n_steps=3)
    faulty = [ex for ex in bench.valset if any(bit // 2 == 0 for bit in decode_ticket(ex.question)[1])]
    instruction = "Given the fields `question`, produce the fields `note0`."

    def followed(world: SyntheticWorld) -> int:
        """Step 0's hinted runs on the examples with a step-0 defect that come out without a symptom."""
        outs = [
            world.task(FakeCall("", "", instruction, {"question": ex.question, HINT_FIELD: "check"}, ["note0"]))
            for ex in faulty
        ]
        return sum("SYM-" not in out["note0"] for out in outs)

    rates = [followed(SyntheticWorld(0, 0, hint_rate=r)) for r in (0.0, 0.4, 0.8, 1.0)]
    assert rates[0] == 0 and rates[-1] == len(faulty) > 10 and rates[0] < rates[1] < rates[2] < rates[3]
    from benchmarks.synthetic import hint_rate

    monkeypatch.setenv("SYNTH_HINT_RATE", "0.4")
    assert hint_rate() == 0.4  # what the benchmark's LM is built with
    monkeypatch.delenv("SYNTH_HINT_RATE")
    assert hint_rate() == 0.8  # the world's default


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


def run_all(bench, lm, program=None) -> list[tuple[str, dict]]:
    """Each validation example's answer and the task LM's step outputs (from its history)."""
    program = program or bench.make_program()
    out = []
    with dspy.context(lm=lm):
        for ex in bench.valset:
            start = len(lm.history)
            pred = program(question=ex.question)
            out.append((pred.answer, [h["outputs"] for h in lm.history[start:]]))
    return out


def test_rewording_changes_the_text_with_the_prompt_but_never_the_values_read(monkeypatch):
    fixed = {}
    for mode in ("repeat", "intermediate", "all"):
        monkeypatch.setenv("SYNTH_REWORD", mode)
        bench = load_benchmark(train=5, val=20, test=5, seed=0, n_steps=3)
        lm = synthetic_lm("synthetic:0,0")
        plain = run_all(bench, lm)
        program = bench.make_program()
        step0 = program.named_predictors()[0][1]
        step0.signature = step0.signature.with_instructions(step0.signature.instructions + " Be careful.")
        changed = run_all(bench, lm, program)
        assert run_all(bench, lm) == plain  # the same prompt gets the same text
        fixed[mode] = [answer for answer, _ in changed]
        assert [a for a, _ in plain] == fixed[mode]  # an instruction without a fix phrase changes no value
        texts_differ = [p[1] != c[1] for p, c in zip(plain, changed)]
        assert not any(texts_differ) if mode == "repeat" else all(texts_differ)
        if mode == "all":  # the last step's reasoning rewords and is part of the program's output
            with dspy.context(lm=lm):
                a = bench.make_program()(question=bench.valset[0].question)
                b = program(question=bench.valset[0].question)
            assert a.answer == b.answer and a.reasoning != b.reasoning
    assert fixed["repeat"] == fixed["intermediate"] == fixed["all"]


def test_an_unknown_rewording_mode_is_refused(monkeypatch):
    monkeypatch.setenv("SYNTH_REWORD", "sometimes")
    try:
        load_benchmark(train=5, val=5, test=5, seed=0, n_steps=3)
    except ValueError as error:
        assert "SYNTH_REWORD" in str(error)
    else:
        raise AssertionError("an unknown mode was accepted")


def test_a_task_token_budget_caps_agentgrad_and_stops_gepa(monkeypatch, tmp_path):
    from benchmarks.harness import run_optimizer

    monkeypatch.setenv("SYNTH_REWORD", "all")
    bench = load_benchmark(train=20, val=20, test=5, seed=0, n_steps=3)
    cap = 30_000
    spent = {}
    for name in ("agentgrad", "gepa"):
        run = run_optimizer(
            name,
            bench.make_program(),
            bench.trainset,
            bench.valset,
            bench.metric,
            task_lm=synthetic_lm("synthetic:0,0"),
            prompt_lm=synthetic_lm("synthetic:0,0"),
            max_metric_calls=2000,
            max_task_tokens=cap,
            num_threads=4,
            hint_fn=bench.hint,
            log_dir=tmp_path / name,
            cache_dir="off",
        )
        task = run.usage["task"]
        spent[name] = (task["prompt_tokens"] + task["completion_tokens"], run.metric_calls)
    assert spent["agentgrad"][0] <= cap and spent["agentgrad"][1] < 2000
    # GEPA stops by tokens, not by metric calls, checked between iterations: at or a little past the cap
    assert spent["gepa"][1] < 2000 and cap <= spent["gepa"][0] <= 1.2 * cap


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


def test_the_timeline_splits_the_wall_by_what_was_in_flight():
    from benchmarks.synthetic.timeline import busy

    calls = [(0, 1, "task", ""), (0.5, 2, "task", ""), (2, 3, "prompt", "gradient"), (4, 5, "task", "")]
    assert busy(calls) == {"task": 3.0, "prompt only": 1.0, "idle": 1.0, "mean task calls in flight": 0.7}
