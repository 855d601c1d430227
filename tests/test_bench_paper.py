"""--preset paper: budgets, splits, GEPA's variant and MIPROv2's settings per benchmark."""

from __future__ import annotations

import json

import dspy
import pytest

from benchmarks import common, harness, load_benchmark, run
from benchmarks.presets import PAPER, gepa_variant

BUDGETS = {"hotpotqa": 6871, "ifbench": 3593, "hover": 7051, "pupa": 2426}


@pytest.fixture(autouse=True)
def _restore_dspy_cache():
    saved = dspy.cache
    yield
    dspy.cache = saved


def _args(*extra):
    return run.build_parser().parse_args(["--bench", "pupa", "--task-lm", "fake", "--out", "x", *extra])


@pytest.mark.parametrize("bench", sorted(BUDGETS))
def test_paper_preset_gives_every_optimizer_the_papers_budget_and_settings(bench):
    settings = run.bench_settings(_args("--preset", "paper"), bench)
    assert settings["max_metric_calls"] == BUDGETS[bench] == PAPER[bench].budget
    assert settings["options"]["gepa"] == {"use_merge": False}
    assert settings["gepa_variant"] == "GEPA (no merge)"
    assert settings["options"]["miprov2"] == {"num_candidates": 18, "max_errors": BUDGETS[bench]}
    assert settings["differs_offline"]  # an offline run says what differs


def test_explicit_flags_override_the_preset():
    args = _args("--preset", "paper", "--max-metric-calls", "100", "--options", '{"gepa": {"use_merge": true}}')
    settings = run.bench_settings(args, "ifbench")
    assert settings["max_metric_calls"] == 100 and settings["options"]["miprov2"]["max_errors"] == 100
    assert gepa_variant(settings["options"]) == "GEPA+Merge"
    plain = run.bench_settings(_args(), "ifbench")
    assert plain["split"] == "seeded" and plain["max_metric_calls"] is None and plain["options"] == {}
    assert plain["gepa_variant"] == "GEPA+Merge"  # dspy.GEPA's default, stated in the results


def test_hotpotqa_offline_cannot_hold_the_paper_split_and_says_so():
    offline = run.bench_settings(_args("--preset", "paper"), "hotpotqa")
    assert (offline["train"], offline["val"], offline["test"], offline["split"]) == (50, 50, 52, "seeded")
    online = run.bench_settings(_args("--preset", "paper", "--source", "online"), "hotpotqa")
    assert online["split"] == "paper" and online["differs_offline"] is None
    with pytest.raises(ValueError, match="--source online"):
        load_benchmark("hotpotqa", split="paper", source="offline", corpus=["A | a"])


def test_artifact_split_procedure():
    items = list(range(1000))
    train, val, test = common.artifact_splits(items)
    assert (len(train), len(val), len(test)) == (150, 300, 300)
    assert set(test) <= set(range(400)) and set(val) <= set(range(400, 800)) and set(train) <= set(range(800, 1000))
    assert common.artifact_splits(items) == [train, val, test]  # fixed by random.Random(1)
    assert common.trim_like_artifact([3, 1, 2], 5) == [3, 1, 2]


def test_ifbench_and_pupa_paper_splits():
    from benchmarks.ifbench import IFEVAL_PROMPTS, read_examples

    bench = load_benchmark("ifbench", split="paper")
    pool = [e.key for e in read_examples(common.data_file(*IFEVAL_PROMPTS), "ifeval")]
    assert len(bench.valset) == 300 and len(bench.trainset) == 150 and len(bench.testset) == 294
    assert [e.key for e in bench.valset] == pool[:300]  # val: the first 300 prompts
    assert {e.key for e in bench.trainset} <= set(pool[300:600])
    assert len(load_benchmark("pupa", split="paper").testset) == 221


def test_miprov2_gets_eighteen_candidates_and_an_error_budget(monkeypatch, tmp_path):
    seen = {}

    class Spy:
        def __init__(self, **kwargs):
            seen.update(kwargs)

        def compile(self, program, **kwargs):
            seen.update(kwargs)
            return program

    monkeypatch.setattr(dspy, "MIPROv2", Spy)
    options = run.bench_settings(_args("--preset", "paper"), "pupa")["options"]
    lm = dspy.LM("fake/none")
    ex = [dspy.Example(q=str(i)).with_inputs("q") for i in range(10)]
    harness.run_optimizer(
        "miprov2",
        dspy.Predict("q -> a"),
        ex,
        ex,
        lambda g, p, t=None: 0.0,
        task_lm=lm,
        prompt_lm=lm,
        max_metric_calls=2426,
        options=options,
        cache_dir="off",
    )
    assert seen["num_candidates"] == 18 and seen["max_errors"] == 2426 and seen["num_trials"] >= 1


def test_preset_dry_run_records_its_setup(tmp_path):
    out = tmp_path / "paper"
    args = ["--bench", "pupa", "--preset", "paper", "--task-lm", "fake", "--prompt-lm", "fake"]
    args += ["--optimizers", "gepa", "--max-metric-calls", "30", "--train", "4", "--val", "4", "--test", "4"]
    assert run.main([*args, "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    block = results["benchmarks"]["pupa"]
    assert results["config"]["preset"] == "paper"
    assert block["info"]["split"].startswith("paper (file order)") and block["info"]["sizes"]["train"] == 4
    assert block["settings"]["gepa_variant"] == "GEPA (no merge)"
    setup = (out / "results.md").read_text()
    assert "preset paper" in setup and "GEPA (no merge)" in setup and "PUPA_New" in setup


def test_hotpotqa_online_without_network_is_a_clear_error(monkeypatch, tmp_path, capsys):
    import dspy.datasets

    def offline(*args, **kwargs):
        raise ConnectionError("Failed to resolve 'huggingface.co'")

    monkeypatch.setattr(dspy.datasets, "HotPotQA", offline)
    args = ["--bench", "hotpotqa", "--source", "online", "--task-lm", "fake", "--out", str(tmp_path)]
    assert run.main(args) == 2
    err = capsys.readouterr().err
    assert "HotpotQA could not be loaded online" in err and "--source offline" in err and "Traceback" not in err


def test_hover_train_online_without_network_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("AGENTGRAD_CACHE_DIR", str(tmp_path))

    def no_network(*args, **kwargs):
        raise OSError("[Errno -2] Name or service not known")

    monkeypatch.setattr("urllib.request.urlopen", no_network)
    with pytest.raises(common.DataUnavailable, match="could not download HoVer train.*--source offline"):
        load_benchmark("hover", source="online", split="paper", corpus=["A | a"])
    assert not list(tmp_path.rglob("*.part"))  # nothing half-written left behind
