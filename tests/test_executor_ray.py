"""Program runs and metric calls on a Ray cluster (``executor="ray"``): the driver keeps the budget, the
journal and the decisions; the decisions are those of local threads at any number of runs in flight; a
worker that dies loses only its run in flight. On a local cluster this test starts (``ray.init(num_cpus=2)``)."""

from __future__ import annotations

import os
import random
import sys
import threading
from pathlib import Path

import dspy
import pytest
from world import Pipeline, World, feedback_metric, make_data, world_lm

from dspy_agentgrad import AgentGrad, RayExecutor
from dspy_agentgrad.config import AgentGradConfig

TRAIN = make_data({"extract": 3, "notes": 2, "answer": 2, "either": 1})
VAL = make_data({"extract": 2, "notes": 1, "none": 2}, start=50)
FAST = dict(auto=None, max_rounds=2, progress=False)


@pytest.fixture(scope="module")
def ray():
    """A local cluster of two worker CPUs; the workers import this checkout and this folder (the program,
    metric and world)."""
    ray = pytest.importorskip("ray", reason="needs the [ray] extra: pip install 'dspy-agentgrad[ray]'")
    here = Path(__file__).resolve().parent
    path = os.pathsep.join([str(here.parent), str(here), *sys.path])
    ray.init(num_cpus=2, runtime_env={"env_vars": {"PYTHONPATH": path}}, include_dashboard=False)
    yield ray
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
    optimizer = AgentGrad(feedback_metric, log_dir=log_dir, config=AgentGradConfig.from_options(**{**FAST, **options}))
    return optimizer.compile(program or Pipeline(), trainset=TRAIN, valset=VAL).detailed_results


@pytest.mark.parametrize("threads", [1, 3])
def test_decisions_on_ray_workers_equal_those_of_local_threads(ray, threads):
    local = run(num_threads=threads)
    remote = run(num_threads=threads, executor="ray")
    assert local.best_val_score > local.initial_val_score  # the world has something to learn
    assert summary(remote) == summary(local)


def drawn_world(seed: int) -> dict:
    """A world drawn from ``seed``: how many examples of each kind, how often a hint is followed, threads."""
    rng = random.Random(seed)
    kinds = ("extract", "notes", "answer", "either", "none")
    return {
        "train": make_data({k: rng.randint(0, 3) for k in kinds}),
        "val": make_data({k: rng.randint(0, 2) + (k == "none") for k in kinds}, start=100),
        "follow": rng.choice([1.0, 0.6]),
        "options": {"num_threads": rng.choice([1, 2, 4]), "speculate": rng.random() < 0.5, "seed": seed},
    }


@pytest.mark.parametrize("seed", range(4))
def test_decisions_on_ray_equal_local_threads_on_drawn_worlds(ray, seed):
    world = drawn_world(seed)
    results = []
    for executor in ("local", "ray"):
        dspy.configure(lm=world_lm(World(hint_follow_rate=world["follow"])))
        optimizer = AgentGrad(
            feedback_metric, config=AgentGradConfig.from_options(executor=executor, **{**FAST, **world["options"]})
        )
        compiled = optimizer.compile(Pipeline(), trainset=world["train"], valset=world["val"])
        results.append(summary(compiled.detailed_results))
    assert results[1] == results[0]


class RecordsProcess(Pipeline):
    """Writes the id of the process each run happens in under ``folder``."""

    folder: str = ""

    def forward(self, question):
        Path(self.folder, str(os.getpid())).touch()
        return super().forward(question)


def test_an_executor_object_joins_the_running_cluster_and_journals_on_the_driver(ray, tmp_path):
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


def test_a_worker_that_dies_loses_only_its_run_in_flight(ray, tmp_path):
    program = DiesOnce()
    program.marker = str(tmp_path / "died")
    remote = run(program, num_threads=2, executor="ray")
    assert Path(program.marker).exists() and int(Path(program.marker).read_text()) != os.getpid()
    assert summary(remote) == summary(run(num_threads=2))  # the run was made again elsewhere


def test_task_lm_caps_are_refused_with_ray_because_they_are_admitted_in_the_driver(ray):
    with pytest.raises(ValueError, match="max_task_calls and max_task_tokens .* cannot be enforced on Ray"):
        run(executor="ray", max_task_calls=10_000)


def test_without_ray_installed_executor_ray_is_refused_naming_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # what an environment without the extra sees
    with pytest.raises(ImportError, match=r"pip install 'dspy-agentgrad\[ray\]'"):
        AgentGrad(feedback_metric, config=AgentGradConfig.from_options(executor="ray"))


def test_an_unknown_executor_is_refused():
    with pytest.raises(ValueError, match="executor must be 'local', 'ray' or an executor object"):
        AgentGrad(feedback_metric, config=AgentGradConfig.from_options(executor="dask"))
    with pytest.raises(ValueError, match="RayExecutor"):
        AgentGrad(feedback_metric, config=AgentGradConfig.from_options(executor=object()))


class UnpicklableTimeout(TimeoutError):
    def __init__(self, message):
        super().__init__(message)
        self.lock = threading.Lock()  # a client's handle, say


def test_an_error_that_cannot_travel_back_comes_as_a_stand_in_of_the_same_kind(ray):
    from dspy_agentgrad.program.executor import portable
    from dspy_agentgrad.program.runs import Execution
    from dspy_agentgrad.runtime.retries import error_kind

    error = UnpicklableTimeout("the retriever timed out")
    execution = portable(Execution(None, error, [], {}, 1, 0, [error]))
    back = ray.cloudpickle.loads(ray.cloudpickle.dumps(execution))
    assert error_kind(back.error) == error_kind(error) == "transient:UnpicklableTimeout"
    assert str(back.error) == "the retriever timed out" and back.predictor_errors[0] is back.error
