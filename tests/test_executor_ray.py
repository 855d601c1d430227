"""Program runs and metric calls on a Ray cluster (``executor="ray"``): the driver keeps the budget, the
journal and the decisions; the decisions are those of local threads at any number of runs in flight; a
worker that dies loses only its run in flight. On a local cluster this test starts (``ray.init(num_cpus=2)``)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import dspy
import pytest
from world import Pipeline, World, feedback_metric, make_data, world_lm

from dspy_agentgrad import AgentGrad, RayExecutor

ray = pytest.importorskip("ray", reason="needs the [ray] extra: pip install 'dspy-agentgrad[ray]'")

TRAIN = make_data({"extract": 3, "notes": 2, "answer": 2, "either": 1})
VAL = make_data({"extract": 2, "notes": 1, "none": 2}, start=50)
FAST = dict(auto=None, max_rounds=2, progress=False, retry_backoff_s=0)


@pytest.fixture(scope="module", autouse=True)
def local_cluster():
    """Two worker CPUs; the workers import this checkout and this folder (the program, metric and world)."""
    here = Path(__file__).resolve().parent
    path = os.pathsep.join([str(here.parent), str(here), *sys.path])
    ray.init(num_cpus=2, runtime_env={"env_vars": {"PYTHONPATH": path}}, include_dashboard=False)
    yield
    ray.shutdown()


def summary(result) -> dict:
    return {
        "instructions": result.final_instructions,
        "val": (result.initial_val_score, result.best_val_score),
        "candidates": [(c.predictor, c.instruction, c.accepted, c.reason, c.val_score) for c in result.candidates],
        "blame": [(b.round, b.example, b.predictor) for b in result.blame] if result.blame else [],
        "metric_calls": result.metric_calls,
        "reused": result.reused_runs,
        "task_usage": result.usage["task"],
        "errors": result.program_errors,
    }


def run(program=None, log_dir=None, **options):
    dspy.configure(lm=world_lm(World()))
    optimizer = AgentGrad(feedback_metric, log_dir=log_dir, **{**FAST, **options})
    return optimizer.compile(program or Pipeline(), trainset=TRAIN, valset=VAL).detailed_results


@pytest.mark.parametrize("threads", [1, 3])
def test_decisions_on_ray_workers_equal_those_of_local_threads(threads):
    local = run(num_threads=threads)
    remote = run(num_threads=threads, executor="ray")
    assert local.best_val_score > local.initial_val_score  # the world has something to learn
    assert summary(remote) == summary(local)


class RecordsProcess(Pipeline):
    """Writes the id of the process each run happens in under ``folder``."""

    folder: str = ""

    def forward(self, question):
        Path(self.folder, str(os.getpid())).touch()
        return super().forward(question)


def test_an_executor_object_joins_the_running_cluster_and_journals_on_the_driver(tmp_path):
    program = RecordsProcess()
    program.folder = str(tmp_path / "pids")
    os.mkdir(program.folder)
    remote = run(program, num_threads=2, executor=RayExecutor(address="auto"), log_dir=tmp_path / "log")
    ran_in = {int(p) for p in os.listdir(program.folder)}
    assert ran_in and os.getpid() not in ran_in  # every run happened in a worker process
    assert (tmp_path / "log" / "result.json").exists()
    resumed = run(num_threads=2, log_dir=tmp_path / "log")  # the local resume replays what the workers paid for
    assert resumed.resumed and summary(resumed) == summary(remote)


class DiesOnce(Pipeline):
    """Kills its worker process the first time it runs ``id2`` (a marker file says it happened)."""

    marker: str = ""

    def forward(self, question):
        if question.startswith("id2 ") and not os.path.exists(self.marker):
            Path(self.marker).write_text(str(os.getpid()))
            os._exit(1)  # the whole worker process dies, as on a lost node
        return super().forward(question)


def test_a_worker_that_dies_loses_only_its_run_in_flight(tmp_path):
    program = DiesOnce()
    program.marker = str(tmp_path / "died")
    remote = run(program, num_threads=2, executor="ray")
    assert Path(program.marker).exists() and int(Path(program.marker).read_text()) != os.getpid()
    assert summary(remote) == summary(run(num_threads=2))  # the run was made again elsewhere


def test_task_lm_caps_are_refused_with_ray_because_they_are_admitted_in_the_driver():
    with pytest.raises(ValueError, match="max_task_calls and max_task_tokens .* cannot be enforced on Ray"):
        run(executor="ray", max_task_calls=10_000)
