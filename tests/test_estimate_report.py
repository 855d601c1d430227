"""Cost estimate before a run, the HTML/PNG report after it, and the ``agentgrad`` command."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap

import dspy
import pytest
from world import Pipeline, World, counted, feedback_metric, make_data, world_lm

from dspy_agentgrad import AgentGrad, AgentGradResult, write_report
from dspy_agentgrad.cli import main as cli_main
from dspy_agentgrad.config import AgentGradConfig
from dspy_agentgrad.core.round_rules import RoundRules
from dspy_agentgrad.reporting.charts import candidate_positions
from dspy_agentgrad.reporting.estimate import build_estimate
from dspy_agentgrad.reporting.projection import RunShape, SampleStats, project_calls
from dspy_agentgrad.reporting.report import render_html, word_diff
from dspy_agentgrad.reporting.results import why_unchanged

FAST = dict(progress=False)


@pytest.fixture
def world():
    w = World()
    dspy.configure(lm=world_lm(w))
    return w


# ---- estimate -------------------------------------------------------------------------------------------

RUNS = {
    "3 rounds": (dict(auto=None, max_rounds=3), {"extract": 4, "notes": 4, "answer": 4, "none": 4}),
    # auto="light" is GEPA's budget (1,195 calls here) with no round limit; 4 rounds as before the
    # budget followed GEPA's
    "auto light, 4 rounds": (dict(max_rounds=4), {"extract": 6, "notes": 6, "answer": 6, "none": 12}),
    "cap 150": (dict(auto=None, max_metric_calls=150), {"extract": 6, "notes": 6, "answer": 6, "none": 12}),
}
# with reuse, also a run that only its own convergence stops (GEPA's budget is ten times what it spends)
REUSE_RUNS = {**RUNS, "auto light": (dict(), {"extract": 6, "notes": 6, "answer": 6, "none": 12})}


@pytest.mark.parametrize("name", sorted(RUNS))
def test_estimated_metric_calls_are_within_30_percent_of_the_run(world, name):
    """Without reuse of unchanged runs, one candidate validated at a time and the (3, 2, 1) schedule: the
    procedure the projection's model of a round was measured on."""
    options, train_kinds = RUNS[name]
    paper_rounds = dict(options, cluster_schedule=(3, 2, 1), validate_together=False)
    estimate, result = _estimate_and_run(paper_rounds, train_kinds, reuse_calls=False)
    assert abs(estimate.metric_calls - result.metric_calls) <= 0.3 * result.metric_calls, (
        estimate.summary(),
        result.metric_calls,
    )


@pytest.mark.parametrize("name", sorted(RUNS))
def test_without_reuse_under_the_default_rounds_the_estimate_is_within_30_percent_of_the_run(world, name):
    """The (2, 1) schedule with candidates validated together: in this world every rewrite fixes all
    failures of its predictor and the run learns in round 0; the sample's rewrites show it."""
    options, train_kinds = RUNS[name]
    estimate, result = _estimate_and_run(options, train_kinds, reuse_calls=False)
    assert estimate.sample.rewrite_wins == estimate.sample.rewrites > 0 and estimate.sample.fix_share == 1.0
    assert estimate.sample.carry_over == 1.0  # they fix the held-out failures as well
    assert abs(estimate.metric_calls - result.metric_calls) <= 0.3 * result.metric_calls, (
        estimate.summary(),
        result.metric_calls,
    )


@pytest.mark.parametrize("name", sorted(REUSE_RUNS))
def test_with_reuse_the_estimate_is_within_30_percent_of_the_run(world, name):
    """With reuse (the default) a check costs only the runs whose output changes: the estimate takes the
    share from the sample's hinted runs that fixed nothing and from its rewrites' runs."""
    options, train_kinds = REUSE_RUNS[name]
    estimate, result = _estimate_and_run(options, train_kinds, reuse_calls=True)
    assert result.reused_runs > 0
    assert abs(estimate.metric_calls - result.metric_calls) <= 0.3 * result.metric_calls, (
        estimate.summary(),
        result.metric_calls,
    )


@pytest.mark.parametrize("reuse_calls", [True, False], ids=["reuse on", "reuse off"])
@pytest.mark.parametrize("name", sorted(REUSE_RUNS))
def test_where_no_rewrite_ever_wins_the_estimate_is_within_30_percent_of_the_run(name, reuse_calls):
    """A world whose predictors ignore instructions (they learn from demonstrations only): every rewrite
    loses on its cluster, nothing is accepted, and the run stops once its runs are all paid. The sample's
    rewrites lose too, and the projection follows them instead of assuming that half win. Its rewrite role
    proposes a lost rewrite again, so once every training example has run, a round's check runs only what
    it ran before and costs no metric call, even without reuse: the run stalls, and the sample saw it."""
    options, train_kinds = REUSE_RUNS[name]
    estimate, result = _estimate_and_run(options, train_kinds, reuse_calls, lambda: World(learns_from="demos"))
    assert result.candidates and not result.accepted  # rewrites were tried, and all lost
    assert result.stop_reason.startswith("stalled") or "max_rounds" in result.stop_reason
    assert estimate.sample.rewrite_wins == 0 < estimate.sample.rewrites and estimate.sample.repeat_share == 1.0
    assert f"0 of {estimate.sample.rewrites} rewrites" in estimate.summary()
    assert "proposed 100% of the losers again" in estimate.summary()
    assert abs(estimate.metric_calls - result.metric_calls) <= 0.3 * result.metric_calls, (
        estimate.summary(),
        result.metric_calls,
    )


SYNTHETIC_RUNS = {"auto light": dict(), "4 rounds": dict(auto=None, max_rounds=4)}
PROCEDURES = {"reuse on": dict(), "reuse off": dict(reuse_calls=False), "paper": dict(preset="paper")}


@pytest.mark.parametrize("procedure", sorted(PROCEDURES))
@pytest.mark.parametrize("name", sorted(SYNTHETIC_RUNS))
def test_on_the_synthetic_benchmark_the_estimate_is_within_30_percent_of_the_run(name, procedure):
    """Here a rewrite fixes only the defects its cluster shows, and an example fails at its first defective
    step: the sample's rewrites fix all the sampled failures but fewer of the held-out ones, and the run
    keeps meeting new failures for several rounds. The projection follows the held-out share."""
    from benchmarks.synthetic import load_benchmark
    from benchmarks.synthetic.world import SyntheticWorld
    from dspy_agentgrad.testing import fake_lm

    bench = load_benchmark(train=50, val=30, test=0, n_steps=4)
    agent = AgentGrad(
        bench.metric,
        hint_fn=bench.hint,
        config=AgentGradConfig.from_options(**FAST, **SYNTHETIC_RUNS[name], **PROCEDURES[procedure]),
    )
    dspy.configure(lm=fake_lm(SyntheticWorld(task_s=0, prompt_s=0)))
    estimate = agent.estimate(bench.make_program(), trainset=bench.trainset, valset=bench.valset)
    dspy.configure(lm=fake_lm(SyntheticWorld(task_s=0, prompt_s=0)))  # nothing cached from the estimate
    result = agent.compile(bench.make_program(), trainset=bench.trainset, valset=bench.valset).detailed_results
    assert estimate.sample.fix_share == 1.0 and estimate.sample.carry_over < 1.0
    assert "as large a share of held-out training examples' failures" in estimate.summary()
    assert abs(estimate.metric_calls - result.metric_calls) <= 0.3 * result.metric_calls, (
        estimate.summary(),
        result.metric_calls,
    )


def _estimate_and_run(options: dict, train_kinds: dict, reuse_calls: bool, make_world=World):
    train = make_data(train_kinds)
    val = make_data({"extract": 2, "notes": 2, "answer": 2, "none": 4}, start=100)
    agent = AgentGrad(feedback_metric, config=AgentGradConfig.from_options(**FAST, **options, reuse_calls=reuse_calls))
    dspy.configure(lm=world_lm(make_world()))
    estimate = agent.estimate(Pipeline(), trainset=train, valset=val)
    dspy.configure(lm=world_lm(make_world()))  # a fresh world: the estimate's runs are not cached for the run
    result = agent.compile(Pipeline(), trainset=train, valset=val).detailed_results
    assert estimate.task_lm_calls > estimate.metric_calls  # three predictors per run
    assert estimate.prompt_lm_calls > 0 and estimate.worst_case_metric_calls >= estimate.metric_calls
    assert estimate.usd is None and estimate.unpriced == ["task", "prompt"]  # the fake LM has no price
    return estimate, result


def test_the_estimate_never_exceeds_the_metric_call_cap(world):
    train = make_data({"extract": 8, "notes": 8, "answer": 8})
    val = make_data({"extract": 4, "none": 4}, start=100)
    estimate = AgentGrad(
        feedback_metric, auto=None, max_metric_calls=40, config=AgentGradConfig.from_options(**FAST)
    ).estimate(Pipeline(), trainset=train, valset=val)
    assert estimate.metric_calls == 40 and estimate.max_metric_calls == 40


def test_with_cap_task_spend_the_projection_stops_where_the_task_spend_reaches_the_cap():
    """Where most hinted runs take their reference's score, the task spend outruns the metric calls: capped, the
    projected run stops at the cap on it (fewer rounds and metric calls); uncapped, it goes on past it."""
    sample = SampleStats(10, 0.6, hints_per_failure=1.0, reuse_rate=0.9, reused_hints=2.0, rerun_share=0.7)
    names = ["extract", "notes", "answer"]
    rules = RoundRules.of(AgentGradConfig())
    plain, capped = (
        project_calls(rules, RunShape(names, set(names), 30, 10, 100, None, cap_task_spend=flag), sample)
        for flag in (False, True)
    )
    assert plain.task > 100 >= plain.metric_calls and capped.task == 100
    assert capped.metric_calls < plain.metric_calls and capped.rounds < plain.rounds


def test_the_estimate_says_what_its_sample_paid():
    """Its sample's metric calls and prompt-LM calls, as the metric and the fake LM counted them: the
    program runs, the hinted runs and one rewrite per blamed predictor with its runs."""
    world = World()
    dspy.configure(lm=world_lm(world))
    metric, calls = counted(feedback_metric)
    train = make_data({"extract": 6, "notes": 6, "answer": 6, "none": 12})
    estimate = AgentGrad(metric, config=AgentGradConfig.from_options(**FAST)).estimate(
        Pipeline(), trainset=train, sample_size=8
    )
    sample = estimate.sample
    assert sample.examples == 8 and sample.paid_metric_calls == len(calls) > sample.runs
    assert sample.paid_prompt_calls == world.calls["gradient"] + world.calls["abstract"] + world.calls["rewrite"]
    assert world.calls["rewrite"] == sample.rewrites == sum(share > 0 for share in sample.blame.values()) > 0
    assert f"which paid {len(calls)} metric calls and {sample.paid_prompt_calls} prompt-LM calls" in estimate.summary()


def test_with_no_training_example_left_to_hold_out_the_estimate_says_what_it_did_not_measure():
    """A training set no larger than the sample leaves no held-out example: the fix of the sampled
    rewrites is taken to reach every failure, and the line names the failures unlike the sampled ones."""
    dspy.configure(lm=world_lm(World()))
    train = make_data({"extract": 2, "notes": 2, "answer": 2, "none": 2})
    estimate = AgentGrad(feedback_metric, config=AgentGradConfig.from_options(**FAST)).estimate(
        Pipeline(), trainset=train, sample_size=8
    )
    assert estimate.sample.rewrite_wins > 0 and estimate.sample.carry_over is None
    assert "not measured: validation" in estimate.summary()
    assert estimate.summary().endswith("and failures unlike the sampled ones)")


def test_without_rewrites_to_try_the_estimate_says_it_assumed_their_wins():
    """With demonstrations as the only candidates the sample tries no rewrite; the line says what it assumed."""
    world = World()
    dspy.configure(lm=world_lm(world))
    train = make_data({"extract": 6, "notes": 6, "answer": 6, "none": 12})
    estimate = AgentGrad(feedback_metric, candidates="demos", config=AgentGradConfig.from_options(**FAST)).estimate(
        Pipeline(), trainset=train
    )
    assert estimate.sample.rewrites == world.calls["rewrite"] == 0 and estimate.sample.failure_rate > 0
    assert "no rewrite tried: 50% assumed to win" in estimate.summary()


def test_usd_and_wall_time_follow_the_measured_sample():
    usage = dict(calls=20, prompt_tokens=2000, completion_tokens=500)
    sample = SampleStats(runs=10, failure_rate=0.5, task_usage=usage, seconds=5.0)
    run = RunShape(["a", "b"], {"a", "b"}, n_train=32, n_val=10, max_metric_calls=None, max_rounds=2)
    one_dollar_per_call = {"task": lambda usage: usage["calls"], "prompt": lambda usage: usage["calls"]}
    est = build_estimate(
        AgentGradConfig.from_options(num_threads=1), sample, run, worst_case=300, prices=one_dollar_per_call
    )
    assert est.task_lm_calls == round(2 * est.metric_calls)
    assert est.usd == est.task_lm_calls + est.prompt_lm_calls
    assert est.wall_time_s == pytest.approx(0.5 * est.metric_calls + 0.25 * est.prompt_lm_calls, rel=0.02)
    faster = build_estimate(AgentGradConfig.from_options(num_threads=4), sample, run, worst_case=300, prices={})
    assert faster.wall_time_s == pytest.approx(est.wall_time_s / 4) and faster.unpriced == ["task", "prompt"]


def test_compile_logs_the_estimate_at_its_start(world, caplog):
    train = make_data({"extract": 3, "notes": 3, "none": 3})
    val = make_data({"extract": 2, "none": 2}, start=100)
    with caplog.at_level(logging.INFO, logger="dspy.agentgrad"):
        AgentGrad(feedback_metric, auto=None, config=AgentGradConfig.from_options(max_rounds=1, **FAST)).compile(
            Pipeline(), trainset=train, valset=val
        )
    lines = [r.getMessage() for r in caplog.records]
    first_round = next(i for i, line in enumerate(lines) if line.startswith("round 0"))
    estimate_line = next(i for i, line in enumerate(lines) if line.startswith("AgentGrad estimate: ~"))
    assert estimate_line < first_round
    assert "metric calls" in lines[estimate_line] and "at num_threads=1" in lines[estimate_line]


# ---- report -----------------------------------------------------------------------------------------------


@pytest.fixture
def finished_run(world, tmp_path):
    dspy.configure(lm=world_lm(World(overfit=("extract",))))
    train = make_data({"extract": 3, "notes": 3, "answer": 3, "none": 3})
    val = make_data({"extract": 2, "notes": 2, "answer": 2, "none": 2}, start=100)
    # one round per stack (stack_rounds=1): the overfitting extract rewrite is then judged in a round of its own,
    # so the run has both a shared validation pass that wins and candidates validated alone
    AgentGrad(
        feedback_metric,
        auto=None,
        log_dir=tmp_path,
        config=AgentGradConfig.from_options(max_rounds=4, stack_rounds=1, **FAST),
    ).compile(Pipeline(), trainset=train, valset=val)
    return tmp_path


def test_the_run_writes_a_self_contained_report(finished_run):
    page = (finished_run / "report.html").read_text()
    result = AgentGradResult.from_dict(json.loads((finished_run / "result.json").read_text()))
    assert page.count("<svg") == 2 and "<script" not in page
    assert "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "") and "https://" not in page
    assert page.count('class="candidate ') == len(result.candidates)
    assert page.count('class="candidate accepted"') == len(result.accepted) > 0
    assert page.count('class="candidate rejected"') == len(result.rejected) > 0  # the overfitting rewrite
    assert "<ins>FIX-notes</ins>" in page and "no gain on validation" in page
    for name, count in result.rounds[0].attributed.items():
        assert f"round 0, {name}: {count}</title>" in page


def test_result_json_keeps_every_failure_and_where_it_was_put(finished_run):
    """Per-failure blame: each round's failures, each on the predictor whose hint fixed it (with its output
    before and with the hint) or on nobody (a hard case); the counts agree with the rounds'."""
    result = AgentGradResult.from_dict(json.loads((finished_run / "result.json").read_text()))
    for r in result.rounds:
        records = [b for b in result.blame if b.round == r.round]
        assert len(records) == sum(r.attributed.values()) + r.hard_cases
        for name, count in r.attributed.items():
            assert sum(b.predictor == name for b in records) == count
        assert sum(b.predictor is None for b in records) == r.hard_cases
    blamed = [b for b in result.blame if b.predictor is not None]
    assert blamed and all(b.example and b.original and b.corrected and b.original != b.corrected for b in blamed)
    assert all("question" in b.example for b in result.blame)


def test_per_example_validation_scores_average_to_the_reported_scores(finished_run):
    result = AgentGradResult.from_dict(json.loads((finished_run / "result.json").read_text()))
    assert len(result.val_examples) == 8 and len({v.example for v in result.val_examples}) == 8
    assert sum(v.initial for v in result.val_examples) / 8 == pytest.approx(result.initial_val_score)
    assert sum(v.best for v in result.val_examples) / 8 == pytest.approx(result.best_val_score)
    assert any(v.change == "up" for v in result.val_examples)


def test_the_report_reads_without_the_source(finished_run):
    """Usage as a table, a glossary of its terms, each validation example before and after, every failure."""
    page = (finished_run / "report.html").read_text()
    result = AgentGradResult.from_dict(json.loads((finished_run / "result.json").read_text()))
    assert "{&quot;" not in page and "<th>LM usage</th>" in page
    assert f'<td class="num">{result.usage["task"]["calls"]:,}</td>' in page
    for term in ("hard", "min cluster", "waiting", "cluster score", "metric call"):
        assert f"<dt>{term}</dt>" in page
    assert page.count("<tr class=") == len(result.val_examples)
    ups = sum(v.change == "up" for v in result.val_examples)
    assert f"{ups} examples improved" in page and page.count('<tr class="up">') == ups
    assert f"{len(result.blame)} failures and where each was put" in page


def test_a_score_with_no_new_metric_call_says_why():
    from dspy_agentgrad.reporting.results import CandidateRecord

    free = CandidateRecord(1, "p", 3, 2, "g", "old", "new", 0.0, 1.0, 0.6, True, "gain", metric_calls=0)
    page = render_html(AgentGradResult(0.6, 0.5, {"p": "new"}, {"p": "old"}, candidates=[free]))
    assert "validation 0.600; 0 metric calls;" not in page
    assert "0 metric calls paid while judged (paid ahead by speculation" in page


def test_candidates_are_placed_on_the_curve_where_they_were_validated(finished_run):
    result = AgentGradResult.from_dict(json.loads((finished_run / "result.json").read_text()))
    positions = candidate_positions(result)
    assert [(calls, score) for calls, score, accepted in positions if accepted] == result.val_history[1:]
    # one point per validation pass: winners validated together (validate_together) share theirs
    validated = [(c.validated_at, c.val_score, c.accepted) for c in result.candidates if c.val_score is not None]
    assert len(validated) > len(positions) == len(set(positions)) and set(validated) == set(positions)
    page = (finished_run / "report.html").read_text()
    assert page.count("<title>rejected candidate at") == sum(not a for _, _, a in positions) > 0


def test_the_report_is_rebuilt_from_result_json_alone(finished_run):
    original = (finished_run / "report.html").read_text()
    (finished_run / "report.html").unlink()
    for other in ("memo.jsonl", "state.json", "result.md"):
        (finished_run / other).unlink(missing_ok=True)
    assert write_report(finished_run).read_text() == original


def test_compile_draws_no_png_and_agentgrad_report_png_draws_both_charts(finished_run, capsys):
    pytest.importorskip("matplotlib")
    names = ("validation_curve.png", "attributions.png")
    assert not any((finished_run / name).exists() for name in names)
    cli_main(["report", str(finished_run), "--png"])
    assert "and the PNG charts in" in capsys.readouterr().out
    for name in names:
        assert (finished_run / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_agentgrad_report_png_without_matplotlib_says_what_to_install(finished_run, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    with pytest.raises(SystemExit, match="the PNG charts need matplotlib: pip install matplotlib"):
        cli_main(["report", str(finished_run), "--png"])
    assert (finished_run / "report.html").exists()


def test_word_diff_marks_removed_and_added_words():
    assert word_diff("answer the question", "answer the question briefly") == ("answer the question <ins>briefly</ins>")
    assert word_diff("say <b> now", "say it") == "say <del>&lt;b&gt; now</del> <ins>it</ins>"


def test_a_report_of_a_run_without_rounds_says_so():
    result = AgentGradResult(0.5, 0.5, {"p": "x"}, {"p": "x"}, val_history=[(4, 0.5)], metric_calls=4)
    page = render_html(result)
    assert "No round ran" in page and "No candidate" in page and page.count("<svg") == 1


def test_importing_the_package_loads_neither_matplotlib_nor_mlflow():
    code = "import sys, dspy_agentgrad; print(sorted(m for m in ('matplotlib', 'mlflow') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# ---- the agentgrad command -------------------------------------------------------------------------------


def test_agentgrad_report_rebuilds_the_page(finished_run, capsys):
    (finished_run / "report.html").unlink()
    cli_main(["report", str(finished_run)])
    assert f"wrote {finished_run / 'report.html'}" in capsys.readouterr().out
    assert (finished_run / "report.html").exists()


def argument_error(argv: list[str], capsys) -> str:
    """The one line an argument error prints (exit status 2)."""
    with pytest.raises(SystemExit) as stopped:
        cli_main(argv)
    assert stopped.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in lines[0]
    return lines[0]


def test_agentgrad_report_on_a_folder_without_a_result_says_what_to_pass(tmp_path, capsys):
    line = argument_error(["report", str(tmp_path)], capsys)
    assert "LOG_DIR" in line and "result.json not found: pass the log_dir of a finished AgentGrad run" in line


def test_agentgrad_estimate_loads_a_job_and_prints_the_estimate(tmp_path, monkeypatch, capsys):
    (tmp_path / "my_job.py").write_text(
        textwrap.dedent(
            """
            import dspy
            from world import Pipeline, World, counted, feedback_metric, make_data, world_lm
            from dspy_agentgrad import AgentGrad
            from dspy_agentgrad.config import AgentGradConfig

            def job():
                dspy.configure(lm=world_lm(World()))
                return {
                    "optimizer": AgentGrad(feedback_metric, config=AgentGradConfig.from_options(progress=False)),
                    "program": Pipeline(),
                    "trainset": make_data({"extract": 4, "none": 4}),
                    "valset": make_data({"extract": 2, "none": 2}, start=100),
                }
            """
        )
    )
    monkeypatch.chdir(tmp_path)
    cli_main(["estimate", "my_job:job", "--json", "--sample-size", "4"])
    printed = json.loads(capsys.readouterr().out)
    assert printed["metric_calls"] > 0 and printed["sample"]["runs"] >= 4
    assert "expected MODULE:FUNC" in argument_error(["estimate", "my_job"], capsys)


def test_agentgrad_help_lists_the_commands():
    out = subprocess.run(
        [sys.executable, "-m", "dspy_agentgrad", "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert all(command in out for command in ("demo", "report", "estimate"))


def test_why_unchanged_says_when_the_budget_stopped_the_run_before_any_candidate_was_judged():
    round_ = {"failures": 12, "attributed": {"locate": 4, "answer": 3}, "gradients": 7, "clusters": 3}
    stop = "budget exhausted (the next candidate check needs up to 9 metric calls)"
    said = why_unchanged([round_], [], stop)
    assert "stopped before a candidate was judged" in said and stop in said
    waiting = why_unchanged([{**round_, "clusters": 0}], [], "max_rounds=1 reached")
    assert "no cluster reached the minimum cluster size" in waiting and "max_rounds=1 reached" in waiting


def test_why_unchanged_names_the_stop_after_candidates_lost():
    round_ = {"failures": 12, "attributed": {"answer": 3}, "gradients": 3, "clusters": 1}
    lost = [{"reason": "no gain on validation"}, {"reason": "no gain on its cluster"}]
    stop = "past the budget in task spend and 4 rounds without a validation gain"
    said = why_unchanged([round_], lost, stop)
    assert "2 candidate(s) were judged" in said and "1 no gain on validation" in said and said.endswith(stop + ".")


PAYLOADS = [
    "![img](http://evil.example/a.png)",
    "<img src=http://evil.example/b.png>",
    "[click](http://evil.example/c)",
    "<a href='http://evil.example/d'>x</a>",
    "http://evil.example/e.png",
]


def test_run_content_stays_inert_in_result_md():
    markdown = pytest.importorskip("markdown")
    from dspy_agentgrad.reporting.results import AgentGradResult, CandidateRecord

    hostile = " ".join(PAYLOADS)
    result = AgentGradResult(
        best_val_score=1.0,
        initial_val_score=0.0,
        final_instructions={"answer": f"Answer well.\n```\n{hostile}\n```\n{hostile}", "n`a`me": hostile},
        initial_instructions={"answer": "Answer."},
        final_demos={"answer": [{"question": f"what is `x`? {hostile}", "answer": f"`` {hostile}"}]},
        candidates=[
            CandidateRecord(0, f"answer {hostile}", 2, 2, hostile, "Answer.", hostile, reason=f"| {hostile} |")
        ],
        stop_reason=hostile,
        program_errors={hostile: 1},
    )
    text = result.to_markdown()
    page = markdown.markdown(text, extensions=["tables", "fenced_code"])
    assert "<img" not in page and "<a " not in page and "<a>" not in page
    assert text.count("evil.example") == page.count("evil.example")  # every payload still shown, as text


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["report", "{tmp}/missing"], "LOG_DIR"),
        (["report", ""], "LOG_DIR"),
        (["report", "{tmp}/a_file"], "LOG_DIR"),
        (["estimate", "nocolon"], "MODULE:FUNC"),
        (["estimate", "nosuchmod:job"], "MODULE:FUNC"),
        (["estimate", "wrong_job:job"], "MODULE:FUNC"),
        (["estimate", "wrong_job:job", "--sample-size", "0"], "--sample-size"),
        (["estimate", "wrong_job:job", "--sample-size", "-2"], "--sample-size"),
        (["demo", "--train", "0"], "--train"),
        (["demo", "--threads", "0"], "--threads"),
        (["demo", "--max-metric-calls", "0"], "--max-metric-calls"),
        (["demo", "--fix-threshold", "2"], "--fix-threshold"),
        (["demo", "--out", "{tmp}/a_file"], "--out"),
    ],
)
def test_an_argument_error_is_one_line_naming_the_option_and_exit_status_2(tmp_path, monkeypatch, capsys, argv, named):
    (tmp_path / "a_file").write_text("not a folder")
    (tmp_path / "wrong_job.py").write_text(
        "def job():\n    return {'optimizer': 'AgentGrad', 'program': None, 'trainset': 'abc'}\n"
    )
    monkeypatch.chdir(tmp_path)
    line = argument_error([a.format(tmp=tmp_path) for a in argv], capsys)  # nothing ran: no LM is configured
    assert f"argument {named}" in line


def test_the_projection_validates_demonstrations_alone_as_the_engine_does():
    """The engine stacks rewrites only: with demonstrations among the candidates every candidate is validated alone,
    whatever ``validate_together`` says, and the projection plays the rounds the same way."""
    sample = SampleStats(10, 0.6, hints_per_failure=1.0, reuse_rate=0.5)
    run = RunShape(["extract", "notes", "answer"], {"extract", "notes", "answer"}, 30, 10, 300, 6)
    for candidates in ("demos", "both"):
        stacked, alone = (
            project_calls(
                RoundRules.of(AgentGradConfig.from_options(candidates=candidates, validate_together=flag)), run, sample
            )
            for flag in (True, False)
        )
        assert (stacked.metric_calls, stacked.rounds) == (alone.metric_calls, alone.rounds)
    rewrites = [
        project_calls(RoundRules.of(AgentGradConfig.from_options(validate_together=flag)), run, sample)
        for flag in (True, False)
    ]
    assert rewrites[0].metric_calls != rewrites[1].metric_calls  # rewrites do share their windows' passes
