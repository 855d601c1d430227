"""The zoo: seeded worlds drawn from stated distributions, the realism knobs of the simulated LMs, the summary's
arithmetic, and one tiny zoo end to end."""

from __future__ import annotations

import json
import math

import pytest

from benchmarks.synthetic import make_examples
from benchmarks.synthetic.realism import Realism
from benchmarks.synthetic.world import SyntheticWorld, decode_ticket, fix_phrase
from benchmarks.zoo import runner
from benchmarks.zoo.__main__ import parse
from benchmarks.zoo.runner import ABLATIONS, ZooSettings, run_variant
from benchmarks.zoo.stops import NoGainStop
from benchmarks.zoo.summary import INF, targets, variant_summary, world_rows, worst_decile_mean
from benchmarks.zoo.worlds import build, draw_world
from dspy_agentgrad.core.stoppers import RunStatus
from dspy_agentgrad.testing import FakeCall
from dspy_agentgrad.testing.fake_lm import HINT_FIELD

STEP0 = "Given the fields `question`, produce the fields `note0`."
STEP1 = "Given the fields `question`, `note0`, produce the fields `note1`."


def step0(world: SyntheticWorld, question: str, instruction: str = STEP0, hint: bool = False) -> str:
    inputs = {"question": question, **({HINT_FIELD: "check"} if hint else {})}
    return world.task(FakeCall("", "", instruction, inputs, ["note0"]))["note0"]


def carriers(count: int, bit: int, seed: int = 0) -> list[str]:
    """Questions of cases that carry defect ``bit`` and not the other defect of its step, from a seeded split."""
    return [
        ex.question
        for ex in make_examples(count, 3, seed)
        if bit in decode_ticket(ex.question)[1] and bit ^ 1 not in decode_ticket(ex.question)[1]
    ]


def test_worlds_are_drawn_reproducibly_and_cover_each_knob_on_and_off():
    assert draw_world(3, 7) == draw_world(3, 7) and draw_world(3, 7) != draw_world(3, 8)
    specs = [draw_world(i, 0) for i in range(200)]
    assert {s.steps for s in specs} == {2, 3, 4, 5} and {s.reword for s in specs} == {"repeat", "intermediate", "all"}
    knobs = (("temperature", 0), ("recall", 1), ("wrong_rule", 0), ("overreach", 0), ("fade", 0), ("paraphrase", 0))
    for knob, off in knobs:
        values = [getattr(s, knob) for s in specs]
        assert 0.25 < sum(v == off for v in values) / len(values) < 0.65, knob
        assert all(0 <= v <= 1 for v in values)
    assert any(s.unseen for s in specs) and any(not s.unseen for s in specs)
    assert any(s.noisy for s in specs) and any(not s.noisy for s in specs)


def test_unseen_defects_are_missing_from_validation_only():
    spec = next(s for s in (draw_world(i, 0) for i in range(50)) if s.unseen)
    bench = build(spec, train=200, val=200, test=200)

    def bits(examples):
        return {bit for ex in examples for bit in decode_ticket(ex.question)[1]}

    assert not bits(bench.valset) & set(spec.unseen)
    assert set(spec.unseen) <= bits(bench.trainset) and set(spec.unseen) <= bits(bench.testset)


def test_a_sampling_task_lm_rewords_every_call_slips_and_sometimes_gets_a_wrong_step_right():
    exact, sampled = (
        SyntheticWorld(0, 0, reword="intermediate"),
        SyntheticWorld(0, 0, reword="intermediate", realism=Realism(temperature=1.0, seed=1)),
    )
    clean = [ex.question for ex in make_examples(300, 3, 0) if not decode_ticket(ex.question)[1]][:100]
    assert len({step0(exact, clean[0]) for _ in range(5)}) == 1
    assert len({step0(sampled, clean[0]) for _ in range(5)}) == 5
    assert all("key=k" in step0(exact, q) for q in clean)
    slips = sum("key=k" not in step0(sampled, q) for q in clean for _ in range(5))
    assert 0 < slips < 0.15 * 500  # a few right steps slip
    faulty = carriers(400, 0)
    assert not any("key=k" in step0(exact, q) for q in faulty)
    right = sum("key=k" in step0(sampled, q) for q in faulty)
    assert 0 < right < 0.4 * len(faulty)  # some wrong steps come out right by chance


def test_a_sampling_lm_follows_a_hint_per_call_not_per_example():
    faulty = carriers(400, 0)[:40]
    exact = SyntheticWorld(0, 0, hint_rate=0.5)
    sampled = SyntheticWorld(0, 0, hint_rate=0.5, realism=Realism(temperature=0.3, seed=2))
    assert all(len({step0(exact, q, hint=True) for _ in range(4)}) == 1 for q in faulty)
    assert any(len({"key=k" in step0(sampled, q, hint=True) for _ in range(6)}) == 2 for q in faulty)


def gradient_call(recall: float, wrong_rule: float = 0.0, seed: int = 0) -> tuple[SyntheticWorld, FakeCall]:
    world = SyntheticWorld(0, 0, realism=Realism(recall=recall, wrong_rule=wrong_rule, seed=seed))
    shown = "note1: key=? (SYM-note1-a); another: key=? (SYM-note1-b)"
    inputs = {"current_instruction": STEP1, "feedback": shown, "examples": shown, "rejected_rewrites": ""}
    return world, FakeCall("", "", "", inputs, ["new_instruction"])


def test_a_forgetful_prompt_lm_misses_part_of_what_it_is_shown():
    world, call = gradient_call(recall=1.0)
    assert all(world.prompt(call)["new_instruction"].count("RULE-") == 2 for _ in range(20))
    world, call = gradient_call(recall=0.5, seed=3)
    counts = [world.prompt(call)["new_instruction"].count("RULE-") for _ in range(200)]
    assert set(counts) == {0, 1, 2} and 0.3 < sum(counts) / 400 < 0.7


def test_a_prompt_lm_that_invents_a_wrong_rule_writes_one_that_breaks_examples():
    world, call = gradient_call(recall=1.0, wrong_rule=1.0)
    rewritten = world.prompt(call)["new_instruction"]
    assert rewritten.count("RULE-") == 3 and "RULE-note1-x" in rewritten
    wrong = STEP0 + " " + rewritten.split(fix_phrase("note1-b"), 1)[1].replace("note1", "note0")
    clean = [ex.question for ex in make_examples(300, 3, 0) if not decode_ticket(ex.question)[1]]
    exact = SyntheticWorld(0, 0)
    broken = sum("key=k" not in step0(exact, q, wrong) for q in clean)
    assert all("key=k" in step0(exact, q) for q in clean) and 0 < broken < len(clean) / 2


def test_a_paraphrasing_prompt_lm_rewords_what_it_writes_but_keeps_its_rules_and_length():
    world, call = gradient_call(recall=1.0)
    assert {world.prompt(call)["new_instruction"] for _ in range(5)} == {
        f"{STEP1} {fix_phrase('note1-a')} {fix_phrase('note1-b')}"
    }
    rules = f"{STEP1} {fix_phrase('note1-a')}"  # nothing left to add: a literal LM hands it back as it was
    inputs = {"current_instruction": rules, "feedback": "note1: key=? (SYM-note1-a)", "rejected_rewrites": ""}
    call = FakeCall("", "", "", inputs, ["new_instruction"])
    assert world.prompt(call)["new_instruction"] == rules
    rewording = SyntheticWorld(0, 0, realism=Realism(paraphrase=1.0, seed=4))
    written = [rewording.prompt(call)["new_instruction"] for _ in range(20)]
    assert rules not in written and len(set(written)) > 5
    assert all(w.split()[1:] == rules.split()[1:] for w in written)  # the rules and the length stay
    assert SyntheticWorld(0, 0).prompt(FakeCall("", "", "", inputs, ["gradient"])) == rewording.prompt(
        FakeCall("", "", "", inputs, ["gradient"])
    )  # only instruction-writing calls are reworded


def test_rules_fade_as_an_instruction_grows_long():
    faulty = carriers(600, 0)
    short = f"{STEP0} {fix_phrase('note0-a')}"
    long = " ".join([short, *(fix_phrase(f"note0-z{k}") for k in range(6))])
    kept = {}
    for fade in (0.0, 0.5):
        world = SyntheticWorld(0, 0, realism=Realism(fade=fade))
        kept[fade] = [sum("key=k" in step0(world, q, text) for q in faulty) for text in (short, long)]
    assert kept[0.0][0] == kept[0.0][1] == len(faulty)
    assert kept[0.5][0] > kept[0.5][1] > 0


def test_interacting_defects_a_fix_exposes_its_partner_downstream_until_both_are_fixed():
    world = SyntheticWorld(0, 0, realism=Realism(interact=1.0))
    source = "note0-a"
    letter = world._partner(source)
    partner = f"note1-{'ab'[letter]}"
    questions = [q for q in carriers(800, 0) if not {2, 3} & set(decode_ticket(q)[1])]
    fixed0 = f"{STEP0} {fix_phrase(source)}"

    def step1(q: str, instruction: str) -> str:
        note0 = step0(world, q, fixed0)
        return world.task(FakeCall("", "", instruction, {"question": q, "note0": note0}, ["note1"]))["note1"]

    exposed = [q for q in questions if f"SYM-{partner}" in step1(q, STEP1)]
    assert 0 < len(exposed) < len(questions)
    assert all("key=k" in step1(q, f"{STEP1} {fix_phrase(partner)}") for q in exposed)
    plain = SyntheticWorld(0, 0)
    assert plain._partner(source) is None


def test_no_gain_stop_ends_a_run_after_rounds_without_a_rise():
    stop = NoGainStop(2)

    def status(rounds: int, best: float | None) -> RunStatus:
        return RunStatus(rounds, 0, 0.5, best, 0.0)

    assert not stop(status(0, None)) and not stop(status(1, 0.5)) and not stop(status(2, 0.6))
    assert not stop(status(3, 0.6)) and stop(status(4, 0.6))
    with pytest.raises(ValueError, match="at least 1"):
        NoGainStop(0)


def entry(val: float, test: float, curve: list, seconds: list, tokens: list, total_tokens: int, wall: float) -> dict:
    return {
        "val_score": val,
        "test_score": test,
        "metric_calls": curve[-1][0],
        "usage": {"task": {"calls": 1, "prompt_tokens": total_tokens, "completion_tokens": 0}},
        "wall_time_s": wall,
        "curve": curve,
        "details": {"curve_seconds": seconds, "curve_task_tokens": tokens, "curve_task_calls": tokens},
    }


def test_ratios_to_gepa_count_a_level_only_the_variant_misses_as_infinite_and_one_only_gepa_misses_as_zero():
    record = {
        "runs": {
            "gepa": entry(0.8, 0.7, [[50, 0.5], [300, 0.8], [400, 0.8]], [2, 20, 30], [100, 600, 800], 800, 40),
            "agentgrad": entry(0.9, 0.75, [[50, 0.5], [100, 0.8], [200, 0.9]], [2, 5, 10], [100, 200, 400], 960, 20),
            "paper": entry(0.7, 0.6, [[50, 0.5], [300, 0.7]], [2, 25], [100, 500], 500, 30),
        }
    }
    rows = world_rows(record)
    ag, paper = rows["agentgrad"]["vs_gepa"], rows["paper"]["vs_gepa"]
    assert ag["gepa_final seconds"] == 5 / 20 and ag["gepa_final task_tokens"] == 200 / 600
    assert ag["whole-run task tokens"] == 1.2 and math.isclose(ag["test - gepa"], 0.05)
    assert paper["gepa_final seconds"] == INF  # 0.7 < GEPA's 0.8
    assert ag["target seconds"] == 0.0 and paper["target task_tokens"] == 1.0  # 90% of 0.9: GEPA (0.8) misses it
    assert rows["agentgrad"]["after_best"] == 0.5 and rows["gepa"]["after_best"] == 0.5
    worlds = [{"noisy": True, "rows": rows}]
    summary = variant_summary(worlds, "agentgrad")
    met = {t: ok for t, _, ok in targets(summary)}
    assert met["median wall to GEPA's final <= 0.4x"] and met["whole-run task tokens <= 1.2x GEPA's in every world"]
    assert not met["median wall after the final best < 25%"]
    assert worst_decile_mean([0.9, 0.1, 0.5]) == 0.1


def test_a_tiny_zoo_runs_end_to_end_and_resumes_without_running_again(tmp_path):
    from benchmarks.zoo.__main__ import main

    options = ["--worlds", "1", "--seed", "0", "--threads", "2", "--jobs", "1", "--out", str(tmp_path)]
    options += ["--variants", "agentgrad,gepa", "--train", "8", "--val", "8", "--test", "8", "--budget", "60"]
    options += ["--task-ms", "0", "--prompt-ms", "0"]
    assert main(options) == 0
    world_file = tmp_path / "worlds" / "world000.json"
    record = json.loads(world_file.read_text())
    assert set(record["runs"]) == {"agentgrad", "gepa"} and not record.get("failed")
    assert record["runs"]["agentgrad"]["metric_calls"] <= 60  # GEPA may finish an iteration past its budget
    assert all(run["metric_calls"] > 8 and 0 <= run["test_score"] <= 1 for run in record["runs"].values())
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["variants"]["agentgrad"]["worlds"] == 1
    assert "Targets" in (tmp_path / "summary.md").read_text()
    assert json.loads((tmp_path / "zoo.json").read_text())["worlds"][0] == record["world"]
    before = world_file.read_text()
    assert main(options) == 0
    assert json.loads(world_file.read_text())["runs"] == json.loads(before)["runs"]  # nothing ran again
    assert main([*options, "--summary-only"]) == 0
    title = (tmp_path / "summary.md").read_text().splitlines()[2]
    assert "--variants agentgrad,gepa" in title and "--summary-only" not in title  # the run summarized, named


@pytest.mark.parametrize("name", list(ABLATIONS))
def test_every_ablation_variant_runs_with_the_options_it_names(name):
    settings = ZooSettings(threads=2, train=8, val=8, test=8, task_s=0.0, prompt_s=0.0, budget=60)
    entry = run_variant(draw_world(0, 0), name, settings)
    assert 0 < entry["metric_calls"] <= 60 and 0 <= entry["test_score"] <= 1


def test_a_variant_that_failed_and_then_ran_is_no_longer_listed_as_failed(tmp_path, monkeypatch):
    outcomes = iter([RuntimeError("an option was renamed"), {"val_score": 0.5}])

    def run_once(spec, name, settings):
        outcome = next(outcomes)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    monkeypatch.setattr(runner, "run_variant", run_once)
    spec = draw_world(0, 0)
    record = json.loads(runner.run_world(spec, ["agentgrad"], ZooSettings(), tmp_path).read_text())
    assert record["failed"] == {"agentgrad": "RuntimeError: an option was renamed"} and not record["runs"]
    record = json.loads(runner.run_world(spec, ["agentgrad"], ZooSettings(), tmp_path).read_text())
    assert record["runs"] == {"agentgrad": {"val_score": 0.5}} and not record["failed"]


def test_an_ablation_keeps_its_default_only_if_the_defaults_do_better_without_a_worse_worst_decile():
    from benchmarks.zoo.summary import ablation_lines

    def world(test_default: float, test_off: float) -> dict:
        runs = {
            "gepa": entry(0.5, 0.5, [[50, 0.5]], [10], [100], 100, 10),
            "agentgrad": entry(0.6, test_default, [[50, 0.5], [60, 0.6]], [2, 5], [100, 120], 120, 10),
            "helps off": entry(0.6, test_off, [[50, 0.5], [60, 0.6]], [2, 5], [100, 120], 120, 10),
            "same off": entry(0.6, test_default, [[50, 0.5], [60, 0.6]], [2, 5], [100, 120], 120, 10),
        }
        return {"noisy": False, "rows": world_rows({"runs": runs})}

    worlds = [world(0.8, 0.6), world(0.7, 0.7), world(0.9, 0.5)]
    verdicts = {
        line.split(" | ")[0][2:]: line.rsplit(" | ", 1)[1][:-2]
        for line in ablation_lines(worlds, ["helps off", "same off"])[5:]
    }
    assert verdicts == {"helps off": "yes", "same off": "no"}


def test_a_variant_whose_name_holds_commas_can_be_named_on_the_command_line():
    args = parse(["--out", "x", "--variants", "agentgrad,gepa,cluster_schedule=(3,2,1),train_batch_size=8"])
    assert args.names == ["agentgrad", "gepa", "cluster_schedule=(3,2,1)", "train_batch_size=8"]
    with pytest.raises(SystemExit):
        parse(["--out", "x", "--variants", "agentgrad,gepa,cluster_schedule=(3"])
