"""Behaviour of the AgentGrad optimizer on the deterministic fake world (tests/world.py)."""

from __future__ import annotations

import json

import dspy
import pytest
from world import (
    Pipeline,
    World,
    agentgrad,
    counted,
    dumps,
    feedback_metric,
    instructions,
    make_data,
    metric,
    partial_metric,
    world_lm,
)

from dspy_agentgrad import AgentGrad, AgentGradResult, MetricError, auto_budget, default_hint
from dspy_agentgrad.config import AgentGradConfig
from dspy_agentgrad.core.state import example_label
from dspy_agentgrad.testing import fake_lm

FAST = dict(progress=False)


def optimizer(metric_fn=feedback_metric, **kwargs) -> AgentGrad:
    options = {"auto": None, "max_rounds": 3, **FAST, **kwargs}
    return agentgrad(metric_fn, **options)


@pytest.fixture
def world():
    w = World()
    dspy.configure(lm=world_lm(w))
    return w


# ---- steps 1-2: attribution ---------------------------------------------------------------------


def test_blame_goes_to_the_faulty_predictor_in_call_order(world):
    program = Pipeline()
    assert [n for n, _ in program.named_predictors()] == ["answer", "extract", "notes"]
    examples = make_data({"extract": 2, "notes": 2, "answer": 1, "none": 2})
    report = optimizer().attribute(program, examples)
    assert report.order == ["extract", "notes", "answer"]
    blamed = {name: sorted(r.example.question for r in recs) for name, recs in report.attributed.items()}
    assert blamed == {
        "extract": ["id0 kind=extract", "id1 kind=extract"],
        "notes": ["id2 kind=notes", "id3 kind=notes"],
        "answer": ["id4 kind=answer"],
    }
    assert len(report.passed) == 2 and report.hard_cases == []
    notes_record = report.attributed["notes"][0]
    assert notes_record.original == {"notes": "no answer found"}
    assert notes_record.corrected == {"notes": "the answer is ans-id2"}
    assert "passages" in notes_record.inputs


def test_failure_fixable_at_two_predictors_goes_to_the_later_one(world):
    report = optimizer().attribute(Pipeline(), make_data({"either": 2}))
    assert len(report.attributed["answer"]) == 2
    assert report.attributed["notes"] == []


def test_upstream_predictors_replay_and_only_the_target_and_later_run_live(world):
    report = optimizer(num_threads=2, speculate=True).attribute(Pipeline(), make_data({"notes": 1}))
    assert [len(report.attributed[n]) for n in ("extract", "notes", "answer")] == [0, 1, 0]
    # original run: 1 call each; hint at answer: answer live; hint at notes: notes and answer live
    sequential = (1, 2, 3)
    # the answer hint changed nothing, so the extract level was run ahead too: extract live, and as its
    # keyword came out as before, notes and answer replayed
    assert (world.calls["extract"], world.calls["notes"], world.calls["answer"]) == (2, 2, 3)
    # nothing is run ahead without reuse, nor at one thread (where it could not save time), nor by default
    for options in (dict(reuse_calls=False, num_threads=2, speculate=True), dict(num_threads=1, speculate=True), {}):
        world.calls.clear()
        optimizer(**options).attribute(Pipeline(), make_data({"notes": 1}))
        assert (world.calls["extract"], world.calls["notes"], world.calls["answer"]) == sequential


def test_hard_cases_are_left_out_of_the_round(world):
    train = make_data({"extract+notes": 2, "extract": 2})
    val = make_data({"extract": 2, "none": 2}, start=50)
    result = (
        optimizer(max_rounds=1, cluster_schedule=(1,), cumulative_hints=False)
        .compile(Pipeline(), trainset=train, valset=val)
        .detailed_results
    )
    assert result.rounds[0].hard_cases == 2
    assert result.rounds[0].attributed == {"extract": 2, "notes": 0, "answer": 0}
    assert (result.rounds[0].explained_single, result.rounds[0].explained_cumulative) == (2, 0)
    assert [c.cluster_size for c in result.candidates] == [2]


def test_cumulative_hints_explain_a_failure_that_needs_two_fixes(world):
    examples = make_data({"extract+notes": 2, "extract": 1})
    report = optimizer().attribute(Pipeline(), examples)
    assert report.hard_cases == [] and (report.explained_single, report.explained_cumulative) == (1, 2)
    # each needed predictor gets a pseudo-label; the answerer's hint was not needed and is dropped
    assert report.counts() == {"extract": 3, "notes": 2, "answer": 0}
    notes = report.attributed["notes"][0]
    assert notes.original == {"notes": "no answer found"} and notes.corrected == {"notes": "the answer is ans-id0"}
    assert "document id0" in notes.inputs["passages"]


def test_by_default_cumulative_hints_wait_for_the_failures_example_to_come_back(world):
    train = make_data({"extract+notes": 2, "extract": 1})
    val = make_data({"none": 2}, start=50)  # already solved: no rewrite gains, so round 1 runs round 0's program
    options = dict(max_rounds=2, cluster_schedule=(1,), stack_rounds=1, val_acceptance="strict")
    rounds = optimizer(**options).compile(Pipeline(), trainset=train, valset=val).detailed_results.rounds
    # the whole training set is each round's batch: round 0 is every example's first, round 1 its second
    seen = [(r.explained_single, r.explained_cumulative, r.cumulative_deferred, r.hard_cases) for r in rounds]
    assert seen == [(1, 0, 2, 2), (1, 2, 0, 0)]
    every = optimizer(cumulative_hints=True, **options).compile(Pipeline(), trainset=train, valset=val)
    assert [(r.explained_cumulative, r.cumulative_deferred) for r in every.detailed_results.rounds[:1]] == [(2, 0)]
    # no example comes back after the last round max_rounds allows: its failures get the pass at once
    last = optimizer(max_rounds=1, cluster_schedule=(1,)).compile(Pipeline(), trainset=train, valset=val)
    assert [(r.explained_cumulative, r.cumulative_deferred) for r in last.detailed_results.rounds] == [(2, 0)]
    # a budget that ends the run before its example comes back: the result says why the double fault stayed a hard case
    lone = optimizer(max_rounds=None, reflect_hard_cases=False, train_batch_size=1, max_metric_calls=4).compile(
        Pipeline(), trainset=make_data({"extract+notes": 2}), valset=val
    )
    assert "1 waited for cumulative hints until their example came back" in lone.detailed_results.why_unchanged()
    with pytest.raises(ValueError, match="cumulative_hints must be True, False or 'revisits'"):
        AgentGradConfig.from_options(cumulative_hints="sometimes")


def test_fix_threshold_lets_a_partial_fix_count_for_graded_metrics(world):
    examples = make_data({"extract+notes": 2})
    strict = optimizer(partial_metric, cumulative_hints=False).attribute(Pipeline(), examples)
    assert strict.counts() == {"extract": 0, "notes": 0, "answer": 0} and len(strict.hard_cases) == 2
    relaxed = optimizer(partial_metric, fix_threshold=0.5, cumulative_hints=False).attribute(Pipeline(), examples)
    assert relaxed.counts() == {"extract": 2, "notes": 0, "answer": 0} and relaxed.hard_cases == []
    with pytest.raises(ValueError, match="fix_threshold"):
        AgentGrad(metric, config=AgentGradConfig.from_options(fix_threshold=2.0))


def test_default_hint_cannot_pin_every_failure_on_the_last_predictor():
    leaky = World(leaky_answer=True)
    dspy.configure(lm=world_lm(leaky))
    examples = make_data({"extract": 2, "notes": 1})
    guarded = optimizer().attribute(Pipeline(), examples)
    assert guarded.counts() == {"extract": 2, "notes": 1, "answer": 0}
    assert guarded.leaked == 3
    trapped = optimizer(leak_check=False).attribute(Pipeline(), examples)
    assert trapped.counts() == {"extract": 0, "notes": 0, "answer": 3}


def test_default_hint_carries_labels_and_feedback():
    example = make_data({"notes": 1})[0]
    hint = default_hint(example, "notes", dspy.Prediction(answer="x"), "expected ans-id0")
    assert "ans-id0" in hint.text and "expected ans-id0" in hint.text and hint.reveals == ("ans-id0",)
    assert default_hint(dspy.Example(q="x").with_inputs("q"), "p", None, "") is None


# ---- step 5: updates and acceptance -------------------------------------------------------------


def test_rewrite_that_wins_its_cluster_but_loses_validation_is_rejected():
    world = World(overfit=("extract",))
    dspy.configure(lm=world_lm(world))
    train = make_data({"extract": 2, "notes": 2})
    val = make_data({"extract": 1, "notes": 1, "none": 4}, start=50)
    result = (
        optimizer(max_rounds=1, cluster_schedule=(1,)).compile(Pipeline(), trainset=train, valset=val).detailed_results
    )
    by_predictor = {c.predictor: c for c in result.candidates}
    extract, notes = by_predictor["extract"], by_predictor["notes"]
    assert (extract.cluster_score_before, extract.cluster_score_after) == (0.0, 1.0)
    assert extract.val_score < result.initial_val_score and not extract.accepted
    assert extract.reason == "no gain on validation"
    assert notes.accepted and notes.val_score > result.initial_val_score
    assert "FIX-extract" not in result.final_instructions["extract"]
    assert "FIX-notes" in result.final_instructions["notes"]


def test_clusters_are_applied_largest_first(world):
    train = make_data({"answer": 1, "notes": 2, "extract": 3})
    val = make_data({"none": 2, "answer": 1}, start=50)
    result = (
        optimizer(max_rounds=1, cluster_schedule=(1,)).compile(Pipeline(), trainset=train, valset=val).detailed_results
    )
    assert [(c.predictor, c.cluster_size) for c in result.candidates] == [("extract", 3), ("notes", 2), ("answer", 1)]


def test_cyclic_schedule_changes_minimum_cluster_size_and_small_clusters_wait(world):
    train = make_data({"extract": 3, "notes": 2, "answer": 1})
    val = make_data({"extract": 1, "notes": 1, "answer": 1, "none": 1}, start=50)
    result = (
        optimizer(max_rounds=3, cluster_schedule=(3, 2, 1))
        .compile(Pipeline(), trainset=train, valset=val)
        .detailed_results
    )
    assert [r.min_cluster_size for r in result.rounds] == [3, 2, 1]
    first = result.rounds[0]
    assert first.clusters == 1 and first.waiting == 3
    assert [c.predictor for c in result.candidates if c.round == 0] == ["extract"]
    assert [c.predictor for c in result.candidates if c.round == 1] == ["notes"]
    assert [c.predictor for c in result.candidates if c.round == 2] == ["answer"]
    assert result.best_val_score == 1.0


# ---- budget, threads, copies, persistence --------------------------------------------------------


@pytest.mark.parametrize("cap", [3, 9, 20, 33, 47])
def test_budget_is_never_exceeded(world, cap):
    metric_fn, calls = counted(feedback_metric)
    train = make_data({"extract": 3, "notes": 2, "answer": 1, "none": 2})
    val = make_data({"extract": 1, "notes": 1, "none": 2}, start=50)
    result = (
        optimizer(metric_fn, max_rounds=None, max_metric_calls=cap)
        .compile(Pipeline(), trainset=train, valset=val)
        .detailed_results
    )
    assert len(calls) <= cap
    assert result.metric_calls == len(calls)
    assert result.max_metric_calls == cap


def test_auto_preset_budget_is_documented_and_respected(world):
    train = make_data({"extract": 3, "none": 3})
    val = make_data({"extract": 1, "none": 1}, start=50)
    metric_fn, calls = counted(feedback_metric)
    result = (
        AgentGrad(metric_fn, auto="light", config=AgentGradConfig.from_options(**FAST))
        .compile(Pipeline(), trainset=train, valset=val)
        .detailed_results
    )
    assert result.max_metric_calls == auto_budget("light", 3, 2) == 2 + 6 * 5 + 31 * 35 + 7 * 2
    assert len(calls) == result.metric_calls <= result.max_metric_calls


def _comparable(result) -> str:
    data = result.to_dict()
    # timings, and LM usage (speculation runs programs ahead at several threads only), may differ; decisions not
    for key in ("wall_time_s", "phase_wall_s", "options", "segments", "usage"):
        data.pop(key)
    data["paid"].pop("wall_time_s")
    data["paid"].pop("task")
    return dumps(data)


def test_results_are_identical_with_1_and_4_threads():
    runs = []
    for threads in (1, 4):
        dspy.configure(lm=world_lm(World()))
        train = make_data({"extract": 3, "notes": 2, "answer": 2, "either": 1, "none": 4})
        val = make_data({"extract": 2, "notes": 1, "answer": 1, "none": 3}, start=50)
        compiled = optimizer(num_threads=threads, max_rounds=3, train_batch_size=6).compile(
            Pipeline(), trainset=train, valset=val
        )
        runs.append(_comparable(compiled.detailed_results))
    assert runs[0] == runs[1]


def test_input_program_is_not_mutated_and_result_is_a_new_program(world):
    program = Pipeline()
    before = instructions(program)
    compiled = optimizer().compile(
        program, trainset=make_data({"extract": 2, "notes": 2}), valset=make_data({"extract": 1, "notes": 1}, start=50)
    )
    assert instructions(program) == before
    assert all("forward" not in vars(p) for _, p in program.named_predictors())
    assert not hasattr(program, "detailed_results")
    assert compiled is not program and instructions(compiled) != before
    assert all("forward" not in vars(p) for _, p in compiled.named_predictors())


def test_compiled_program_saves_and_loads(world, tmp_path):
    compiled = optimizer().compile(
        Pipeline(),
        trainset=make_data({"extract": 2, "notes": 2}),
        valset=make_data({"extract": 1, "notes": 1}, start=50),
    )
    path = tmp_path / "program.json"
    compiled.save(str(path))
    loaded = Pipeline()
    loaded.load(str(path))
    assert instructions(loaded) == instructions(compiled)
    assert loaded(question="id7 kind=extract").answer == "ans-id7"


def test_end_to_end_compile_raises_the_score_to_the_maximum(world, tmp_path):
    train = make_data({"extract": 3, "notes": 2, "answer": 2, "either": 1, "none": 2})
    val = make_data({"extract": 2, "notes": 2, "answer": 1, "none": 2}, start=50)
    test = make_data({"extract": 2, "notes": 2, "answer": 2, "either": 1, "none": 1}, start=100)
    baseline = dspy.Evaluate(devset=test, metric=metric, display_progress=False)(Pipeline()).score
    compiled = optimizer(max_rounds=4, log_dir=tmp_path).compile(Pipeline(), trainset=train, valset=val)
    result = compiled.detailed_results
    assert result.initial_val_score < 0.5 and result.best_val_score == 1.0
    assert baseline < 50 and dspy.Evaluate(devset=test, metric=metric, display_progress=False)(compiled).score == 100.0
    saved = json.loads((tmp_path / "result.json").read_text())
    assert saved["best_val_score"] == 1.0
    assert [c["predictor"] for c in saved["candidates"] if c["accepted"]] == [c.predictor for c in result.accepted]
    assert result.accepted and all(c["val_score"] is not None for c in saved["candidates"] if c["accepted"])
    assert AgentGradResult.from_dict(saved).to_dict() == saved
    assert (tmp_path / "result.md").read_text().startswith("# AgentGrad run")
    assert set(result.usage["by_phase"]) >= {  # cluster checks ("minibatch") may all have run ahead, as "validate"
        "evaluate",
        "intervene",
        "validate",
        "gradient",
        "abstract",
        "rewrite",
    }
    assert result.usage["task"]["calls"] > 0 and result.usage["prompt"]["calls"] > 0
    assert result.usage["prompt"]["prompt_tokens"] > 0


def test_validation_results_are_reused_not_recomputed(world):
    metric_fn, calls = counted(feedback_metric)
    val = make_data({"none": 4}, start=50)
    opt = optimizer(metric_fn, max_rounds=2)
    result = opt.compile(Pipeline(), trainset=make_data({"none": 3}), valset=val).detailed_results
    # nothing fails: one validation pass and one training pass, nothing evaluated twice
    assert result.stop_reason == "no failures left on the training set"
    assert len(calls) == result.metric_calls == 7


# ---- faults --------------------------------------------------------------------------------------


def test_lm_errors_score_as_failures_and_are_counted(world):
    train = make_data({"boom": 2, "extract": 2})
    val = make_data({"boom": 1, "extract": 1, "none": 2}, start=50)
    result = (
        optimizer(max_rounds=1, cluster_schedule=(1,)).compile(Pipeline(), trainset=train, valset=val).detailed_results
    )
    assert result.initial_val_score == 0.5
    assert result.program_errors["error"] >= 3
    assert result.best_val_score == 0.75  # the crashing examples never count as solved
    assert result.rounds[0].hard_cases == 2


def test_failing_aggregator_falls_back_to_tfidf_and_the_run_goes_on():
    world = World(garbage_roles=True)
    dspy.configure(lm=world_lm(world))
    result = (
        optimizer(max_rounds=1, cluster_schedule=(1,))
        .compile(
            Pipeline(),
            trainset=make_data({"extract": 2, "notes": 2}),
            valset=make_data({"extract": 1, "notes": 1}, start=50),
        )
        .detailed_results
    )
    assert result.prompt_role_failures["abstract"] >= 1
    assert result.best_val_score == 1.0


# ---- ablations -----------------------------------------------------------------------------------


class GradientCalls(World):
    """The test world, keeping the inputs of every gradient-role call."""

    def __init__(self):
        super().__init__()
        self.gradient_calls: list[dict] = []

    def _role(self, call):
        if "gradient" in call.output_fields and "generalized_gradient" not in call.output_fields:
            self.gradient_calls.append(dict(call.inputs))
        return super()._role(call)


def test_ablation_switches_change_the_algorithm():
    world = GradientCalls()
    dspy.configure(lm=world_lm(world))
    train = make_data({"extract": 2, "notes": 2})
    val = make_data({"extract": 1, "notes": 1}, start=50)
    no_target = (
        optimizer(max_rounds=1, target_identification=False)
        .compile(Pipeline(), trainset=train, valset=val)
        .detailed_results
    )
    # round-robin: round 0 blames the first predictor in execution order for every failure
    assert no_target.rounds[0].attributed == {"extract": 4, "notes": 0, "answer": 0}
    before = world.calls["abstract"]
    optimizer(max_rounds=1, semantic_abstraction=False).compile(Pipeline(), trainset=train, valset=val)
    assert world.calls["abstract"] == before
    asked = len(world.gradient_calls)
    system = (
        optimizer(max_rounds=2, agent_supervision=False)
        .compile(Pipeline(), trainset=train, valset=val)
        .detailed_results
    )
    assert system.best_val_score == 1.0
    # without agent-level supervision the gradient role sees the system's output and the gold label, never a
    # pseudo-label; with it, every gradient call is shown one
    off = world.gradient_calls[asked:]
    assert off and all("corrected_output" not in c and "expected" in c and "program_output" in c for c in off)
    assert all("corrected_output" in c for c in world.gradient_calls[:asked])


# ---- input checks --------------------------------------------------------------------------------


class NoPredictors(dspy.Module):
    def forward(self, question):
        return dspy.Prediction(answer=question)


def test_bad_inputs_get_clear_errors(world):
    train = make_data({"extract": 2})
    with pytest.raises(ValueError, match="trainset is empty"):
        optimizer().compile(Pipeline(), trainset=[])
    with pytest.raises(ValueError, match="no predictors"):
        optimizer().compile(NoPredictors(), trainset=train)
    with pytest.raises(ValueError, match="auto must be one of"):
        AgentGrad(metric, auto="fast")
    with pytest.raises(ValueError, match="pass auto=None"):
        AgentGrad(metric, auto="light", max_metric_calls=100)
    # a budget in calls alone replaces the default preset, as dspy.GEPA(max_metric_calls=N) reads
    assert AgentGrad(metric, max_metric_calls=100).config.budget.auto is None
    assert AgentGrad(metric, max_full_evals=2).config.budget.auto is None
    assert (
        AgentGrad(metric, config=AgentGradConfig.from_options(max_rounds=2)).config.budget.auto == "light"
    )  # a round cap still runs under the preset
    with pytest.raises(ValueError, match="no budget"):
        AgentGrad(metric, auto=None)
    with pytest.raises(ValueError, match="num_threads"):
        AgentGrad(metric, num_threads=0)
    with pytest.raises(TypeError, match="unexpected keyword"):
        AgentGrad(metric, max_calls=5)
    with pytest.raises(TypeError, match="unknown options"):
        optimizer().compile(Pipeline(), trainset=train, bogus=1)
    with pytest.raises(ValueError, match="with_inputs"):
        optimizer().compile(Pipeline(), trainset=[dspy.Example(question="q", answer="a")])
    with pytest.raises(MetricError, match="must return a number"):
        optimizer(lambda e, p, t=None: "good").compile(Pipeline(), trainset=train, valset=train)
    with pytest.raises(TypeError, match="metric must be callable"):
        AgentGrad("exact_match")


def test_plain_gepa_and_dict_metrics_are_accepted(world):
    train, val = make_data({"extract": 2}), make_data({"extract": 1, "none": 1}, start=50)
    for metric_fn in (metric, feedback_metric, lambda e, p, t=None: {"score": metric(e, p), "feedback": "x"}):
        result = (
            optimizer(metric_fn, max_rounds=1, cluster_schedule=(1,))
            .compile(Pipeline(), trainset=train, valset=val)
            .detailed_results
        )
        assert (result.initial_val_score, result.best_val_score) == (0.5, 1.0)


def test_get_params_lists_the_options():
    params = AgentGrad(metric, auto="medium", seed=3).get_params()
    assert params["auto"] == "medium" and params["seed"] == 3 and params["metric"] is metric


def test_valset_is_split_from_trainset_when_missing(world):
    # a third is held out for validation, the rest is learned from: sizes, disjoint, each used for its part
    train = make_data({"extract": 4, "notes": 2, "none": 3})
    result = optimizer(max_rounds=1).compile(Pipeline(), trainset=train).detailed_results
    labels = {example_label(e): e for e in train}
    held_out = [v.example for v in result.val_examples]
    assert len(held_out) == 3 and set(held_out) <= set(labels)
    assert result.rounds[0].batch_size == 6  # every other example, in one batch
    blamed = {example_label(dspy.Example(**b.example).with_inputs("question")) for b in result.blame}
    assert blamed and not blamed & set(held_out)  # the failures learned from are never validation examples
    assert blamed == {k for k, e in labels.items() if "none" not in e.question} - set(held_out)
    assert result.initial_val_score == sum(e.question.find("none") > 0 for e in map(labels.get, held_out)) / 3


def test_an_unchanged_program_comes_with_the_reason(caplog):
    """A task LM that ignores hints leaves every failure a hard case: the result and the log say so."""

    class Two(dspy.Module):
        def __init__(self):
            super().__init__()
            self.a = dspy.Predict("q -> x")
            self.b = dspy.Predict("q, x -> y")

        def forward(self, q):
            return self.b(q=q, x=self.a(q=q).x)

    dspy.configure(lm=fake_lm(lambda call: {f: "wrong" for f in call.output_fields}))
    data = [dspy.Example(q=f"q{i}", y=f"y{i}").with_inputs("q") for i in range(8)]
    with caplog.at_level("WARNING", logger="dspy.agentgrad"):
        result = (
            optimizer(lambda e, p: float(p.y == e.y), max_rounds=2)
            .compile(Two(), trainset=data[:5], valset=data[5:])
            .detailed_results
        )
    assert not result.accepted and result.hard_cases == 10
    assert "every failure was a hard case" in result.why_unchanged()
    # this LM answers "wrong" whatever it is told: the reflections' rewrites cannot fix the hard cases either
    assert "Reflections on them gave 10 gradient(s): 2 candidate(s) were judged" in result.why_unchanged()
    assert "unchanged: none of the 10 failures could be attributed" in result.to_markdown()
    assert any("returns the program unchanged" in r.getMessage() for r in caplog.records)
