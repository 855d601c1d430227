"""What a DSPy user sees in the first hour: the log on DSPy's logger, the progress bar, GEPA's option
names, stop callbacks and wandb tracking (fake world, read back from the console, the log and wandb)."""

from __future__ import annotations

import json
import logging
import re

import dspy
import pytest
from world import Pipeline, World, agentgrad, feedback_metric, make_data, world_lm

from dspy_agentgrad import AgentGrad, RunStatus, ScoreThresholdStopper, TimeoutStopCondition
from dspy_agentgrad.config import AgentGradConfig

TRAIN = {"extract": 3, "notes": 3, "answer": 3, "none": 3}
VAL = {"extract": 2, "notes": 2, "answer": 2, "none": 2}


@pytest.fixture
def world():
    w = World(overfit=("notes",))  # one rewrite wins on its cluster and loses on validation: both verdicts
    dspy.configure(lm=world_lm(w))
    return w


def data():
    return make_data(TRAIN), make_data(VAL, start=100)


def optimizer(**kwargs) -> AgentGrad:
    return agentgrad(feedback_metric, **{"auto": None, "max_rounds": 3, **kwargs})


def console_lines(text: str) -> list[str]:
    """What a terminal shows, line by line: tqdm redraws its line with carriage returns."""
    return [part for line in text.splitlines() for part in line.split("\r") if part.strip()]


# ---- the log ---------------------------------------------------------------------------------------------


def test_a_compile_prints_its_story_on_dspys_console_by_default(world, capsys):
    train, val = data()
    result = optimizer(progress=False).compile(Pipeline(), trainset=train, valset=val).detailed_results
    err = capsys.readouterr().err
    lines = [line for line in console_lines(err) if " INFO dspy.agentgrad: " in line]
    text = "\n".join(lines)
    assert "AgentGrad: optimizing 3 predictor(s) (answer, extract, notes) on 12 training and 8 validation" in text
    assert re.search(r"AgentGrad estimate: ~\d+ metric calls", text)
    assert len([line for line in lines if re.search(r"round \d+: \d+/\d+ failed", line)]) == len(result.rounds)
    verdicts = [line for line in lines if re.search(r"round \d+: (ACCEPTED|rejected) rewrite of ", line)]
    assert len(verdicts) == len(result.candidates) and len(result.accepted) and len(result.rejected)
    assert lines[-1].endswith(
        f"AgentGrad stopped: {result.stop_reason}; validation {result.initial_val_score:.4f} -> "
        f"{result.best_val_score:.4f} after {result.metric_calls} metric calls in {len(result.rounds)} round(s)"
    )


def test_dspy_disable_logging_silences_it(world, capsys):
    train, val = data()
    dspy.disable_logging()
    try:
        optimizer(progress=False).compile(Pipeline(), trainset=train, valset=val)
    finally:
        dspy.enable_logging()
    assert "dspy.agentgrad" not in capsys.readouterr().err


def test_each_round_line_gives_failures_blame_per_predictor_and_hard_cases(world, caplog):
    train, val = data()
    with caplog.at_level(logging.INFO, logger="dspy.agentgrad"):
        result = optimizer(progress=False).compile(Pipeline(), trainset=train, valset=val).detailed_results
    messages = [r.getMessage() for r in caplog.records]
    for record in result.rounds:
        blame = ", ".join(f"{name} {n}" for name, n in record.attributed.items())
        expected = f"round {record.round}: {record.failures}/{record.batch_size} failed"
        if record.failures:
            expected += f"; blamed: {blame}; {record.hard_cases} hard case(s)"
        assert expected in messages
    for c in result.candidates:
        line = f"round {c.round}: {'ACCEPTED' if c.accepted else 'rejected'} rewrite of {c.predictor} (cluster of "
        assert any(m.startswith(f"{line}{c.cluster_size}): {c.reason}") for m in messages), line
    assert messages[-1].startswith(f"AgentGrad stopped: {result.stop_reason};")


def test_verbose_adds_each_candidates_gradient_and_instruction(world, caplog):
    train, val = data()
    with caplog.at_level(logging.INFO, logger="dspy.agentgrad"):
        quiet = optimizer(progress=False).compile(Pipeline(), trainset=train, valset=val).detailed_results
    assert "instruction:" not in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="dspy.agentgrad"):
        optimizer(progress=False, verbose=True).compile(Pipeline(), trainset=train, valset=val)
    proposed = [c for c in quiet.candidates if c.instruction]
    shown = [m for m in caplog.messages if "\n  instruction: " in m]
    assert len(shown) == len(proposed) > 0
    for c in proposed:
        head = f"round {c.round}: rewrite of {c.predictor} for a cluster of {c.cluster_size}"
        assert f"{head}\n  gradient: {c.gradient}\n  instruction: {c.instruction}" in shown


def test_without_a_valset_the_split_is_logged(world, caplog):
    train = make_data({"extract": 3, "notes": 3, "none": 3})
    with caplog.at_level(logging.INFO, logger="dspy.agentgrad"):
        result = optimizer(max_rounds=1, progress=False).compile(Pipeline(), trainset=train).detailed_results
    assert "no valset given: holding out 3 of the 9 training examples for validation" in caplog.text
    assert "AgentGrad learns from the other 6" in caplog.text and len(result.rounds) == 1


# ---- the progress bar -------------------------------------------------------------------------------------


def bar_counts(err: str) -> list[tuple[int, int, str]]:
    """(n, total, description) of every progress bar line drawn, in order."""
    found = re.findall(r"^(AgentGrad[^|\n]*?):\s+\d+%\|[^|]*\| (\d+)/(\d+)", "\n".join(console_lines(err)), re.M)
    return [(int(n), int(total), desc) for desc, n, total in found]


BAR_RUNS = [dict(max_rounds=3), dict(max_metric_calls=60), dict(max_rounds=None, auto="light")]


@pytest.mark.parametrize("options", BAR_RUNS)
def test_the_bar_follows_the_projection_and_closes_at_100_percent_with_the_stop_reason(world, capsys, options):
    train, val = data()
    result = optimizer(**options).compile(Pipeline(), trainset=train, valset=val).detailed_results
    err = capsys.readouterr().err
    drawn = bar_counts(err)
    estimate = int(re.search(r"AgentGrad estimate: ~(\d+) metric calls", err).group(1))
    assert drawn[0][1] == estimate  # the first total drawn is the projection at the start
    assert drawn[-1] == (result.metric_calls, result.metric_calls, f"AgentGrad stopped: {result.stop_reason}")
    assert re.search(rf"AgentGrad stopped: {re.escape(result.stop_reason)}: 100%", err)
    assert all(n <= total for n, total, _ in drawn)
    if "max_metric_calls" not in options:  # projected again from each round's measures, between start and end
        assert len({total for _, total, _ in drawn[1:-1]} - {estimate, result.metric_calls}) >= 1


def test_after_the_first_round_the_projection_is_within_30_percent_of_the_run(caplog):
    """The start projection knows only the validation score; the first round measures hints, blame and reuse."""
    dspy.configure(lm=world_lm(World()))
    train = make_data({"extract": 6, "notes": 6, "answer": 6, "none": 12})
    val = make_data({"extract": 2, "notes": 2, "answer": 2, "none": 4}, start=100)
    with caplog.at_level(logging.INFO, logger="dspy.agentgrad"):
        result = AgentGrad(feedback_metric, config=AgentGradConfig.from_options(progress=False)).compile(
            Pipeline(), trainset=train, valset=val
        )
    projected = [int(p) for p in re.findall(r"round \d+ done: .* metric calls of ~(\d+) projected", caplog.text)]
    actual = result.detailed_results.metric_calls
    assert len(projected) == len(result.detailed_results.rounds) and projected[-1] == actual
    assert abs(projected[0] - actual) <= 0.3 * actual, (projected, actual)


# ---- GEPA's names -------------------------------------------------------------------------------------------


def test_reflection_lm_is_gepas_name_for_the_prompt_model(world):
    train, val = data()
    reflection = World()
    result = AgentGrad(
        feedback_metric,
        auto=None,
        reflection_lm=world_lm(reflection),
        config=AgentGradConfig.from_options(max_rounds=2, progress=False),
    ).compile(Pipeline(), trainset=train, valset=val)
    assert sum(reflection.calls[role] for role in ("gradient", "abstract", "rewrite")) > 0
    assert world.calls["gradient"] == world.calls["rewrite"] == 0 and world.calls["extract"] > 0
    assert result.detailed_results.accepted


def test_an_option_given_under_both_names_is_a_clear_error():
    lm = world_lm(World())
    with pytest.raises(ValueError, match="prompt_model= and reflection_lm= are one option"):
        AgentGrad(feedback_metric, prompt_model=lm, reflection_lm=lm)
    # max_score is a config field and perfect_score a keyword: the keyword wins, as every keyword over config=
    config = AgentGradConfig.from_options(max_score=1.0)
    assert AgentGrad(feedback_metric, perfect_score=2.0, config=config).config.scores.max_score == 2.0
    with pytest.raises(ValueError, match="max_metric_calls and max_full_evals both set the budget"):
        AgentGrad(feedback_metric, auto=None, max_metric_calls=100, max_full_evals=2)
    with pytest.raises(ValueError, match="pass auto=None to use max_full_evals"):
        AgentGrad(feedback_metric, auto="light", max_full_evals=2)
    with pytest.raises(ValueError, match="max_full_evals must be an integer >= 1"):
        AgentGrad(feedback_metric, auto=None, max_full_evals=0)


def test_perfect_score_sets_the_metrics_maximum():
    assert AgentGrad(feedback_metric, perfect_score=2.0).config.scores.max_score == 2.0
    assert AgentGrad(feedback_metric).config.scores.max_score == 1.0


def test_max_full_evals_counts_passes_over_train_and_validation_as_gepa_does(world):
    train, val = data()
    result = AgentGrad(
        feedback_metric, auto=None, max_full_evals=2, config=AgentGradConfig.from_options(progress=False)
    ).compile(Pipeline(), trainset=train, valset=val)
    assert result.detailed_results.max_metric_calls == 2 * (len(train) + len(val))
    assert result.detailed_results.metric_calls <= 2 * (len(train) + len(val))


def test_gepas_instruction_proposer_protocol_is_refused_at_once():
    def gepa_proposal(candidate, reflective_dataset, components_to_update):
        return {}

    with pytest.raises(TypeError, match="dspy.GEPA's instruction_proposer, .*, is another protocol"):
        AgentGrad(feedback_metric, instruction_proposer=gepa_proposal)
    AgentGrad(feedback_metric, instruction_proposer=lambda request: None)  # AgentGrad's protocol: accepted


# ---- stop callbacks ---------------------------------------------------------------------------------------


def test_a_target_score_stops_the_run_after_the_verdict_that_reaches_it(world):
    train, val = data()
    # candidates validated one by one, so that the first accepted rewrite is not yet the run's best
    one_by_one = dict(max_rounds=4, progress=False, validate_together=False)
    full = optimizer(**one_by_one).compile(Pipeline(), trainset=train, valset=val).detailed_results
    target = full.val_history[1][1]  # the best score after the first accepted rewrite
    stopped = (
        optimizer(**one_by_one, stop_callbacks=[ScoreThresholdStopper(target)])
        .compile(Pipeline(), trainset=train, valset=val)
        .detailed_results
    )
    assert stopped.stop_reason.startswith(f"stop callback ScoreThresholdStopper(threshold={target}) said stop")
    assert stopped.best_val_score == target < full.best_val_score
    assert stopped.candidates[-1].accepted and len(stopped.accepted) == 1
    assert stopped.metric_calls < full.metric_calls


def test_a_wall_time_limit_stops_before_the_next_round(world):
    train, val = data()
    result = (
        optimizer(progress=False, stop_callbacks=TimeoutStopCondition(timeout_seconds=0))
        .compile(Pipeline(), trainset=train, valset=val)
        .detailed_results
    )
    assert result.stop_reason.startswith("stop callback TimeoutStopCondition(timeout_seconds=0) said stop")
    assert result.rounds == [] and result.best_val_score == result.initial_val_score


def test_a_stop_callback_sees_where_the_run_stands(world):
    seen: list[RunStatus] = []

    def watch(status: RunStatus) -> bool:
        seen.append(status)
        return False

    train, val = data()
    result = optimizer(progress=False, stop_callbacks=[watch]).compile(Pipeline(), trainset=train, valset=val)
    result = result.detailed_results
    assert [s.rounds for s in seen] == sorted(s.rounds for s in seen) and seen[-1].rounds == len(result.rounds)
    assert seen[-1].metric_calls == result.metric_calls and seen[-1].best_val_score == result.best_val_score
    assert seen[-1].initial_val_score == result.initial_val_score and seen[-1].elapsed_s >= 0


def test_a_stop_callback_that_is_not_callable_is_refused():
    with pytest.raises(TypeError, match="stop_callbacks holds 0.9, which is not callable"):
        AgentGrad(feedback_metric, stop_callbacks=[0.9])


# ---- wandb ---------------------------------------------------------------------------------------------------


@pytest.fixture
def wandb_offline(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    return wandb


def test_use_wandb_logs_into_the_active_run(world, wandb_offline, tmp_path):
    train, val = data()
    run = wandb_offline.init(project="agentgrad-test", dir=str(tmp_path))
    try:
        result = optimizer(progress=False, use_wandb=True).compile(Pipeline(), trainset=train, valset=val)
        summary, config = dict(run.summary), dict(run.config)
    finally:
        run.finish()
    result = result.detailed_results
    assert summary["agentgrad/stop_reason"] == result.stop_reason
    assert summary["agentgrad/best_val_score"] == result.best_val_score
    assert summary["metric_calls"] == summary["agentgrad/metric_calls"] == result.metric_calls
    assert summary["agentgrad/candidates_accepted"] == len(result.accepted)
    assert summary["agentgrad/candidates_rejected"] == len(result.rejected)
    assert config["agentgrad.max_rounds"] == 3 and config["agentgrad.predictors"] == ["answer", "extract", "notes"]


def test_use_wandb_opens_and_finishes_its_own_run_with_a_candidate_table(world, wandb_offline, tmp_path):
    train, val = data()
    result = optimizer(
        progress=False, use_wandb=True, wandb_init_kwargs={"project": "agentgrad-test", "dir": str(tmp_path)}
    ).compile(Pipeline(), trainset=train, valset=val)
    assert wandb_offline.run is None  # finished
    tables = list(tmp_path.glob("wandb/offline-run-*/files/media/table/agentgrad/candidates_*.table.json"))
    assert len(tables) == 1
    table = json.loads(tables[0].read_text())
    candidates = result.detailed_results.candidates
    assert len(table["data"]) == len(candidates)
    column = table["columns"].index("accepted")
    assert [row[column] for row in table["data"]] == [c.accepted for c in candidates]


def test_without_wandb_the_option_says_how_to_install(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_wandb(name, *args, **kwargs):
        if name == "wandb":
            raise ImportError("no wandb")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_wandb)
    with pytest.raises(ImportError, match=r"dspy-agentgrad\[wandb\]"):
        AgentGrad(feedback_metric, use_wandb=True)
