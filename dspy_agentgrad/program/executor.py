"""Where program runs and metric calls run: threads of this process, or the workers of a Ray cluster.

The evaluator decides what runs, in what order, and pays for it: budget reservations, the journal, the
choice of references, and every decision stay in the driver process. An executor only says where one
program run (:meth:`ProgramRunner.execute`) and one metric call (:meth:`ProgramRunner.score`) happen.
``"local"`` runs them in the evaluator's threads. ``"ray"`` (or :class:`RayExecutor` with a cluster
address) sends each to a Ray task: the worker gets the runner once (the program, metric and LM, pickled),
then per run the program state, the example, the hints, the calls to replay and the reference run, and
sends back the outputs, the calls of every predictor (each LM answer, for the journal), usage and errors.
The evaluator's threads wait on those tasks, so ``num_threads`` stays the number of runs in flight, and the
runs asked for and their results are the same as with local threads: so are the decisions.

A Ray worker process that dies takes only its run in flight with it: Ray runs that task again on another
worker (``max_task_retries``). Errors of the program or the metric come back as values and are counted
as they are locally, never retried by Ray.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

import dspy

from ..runtime.retries import is_transient
from .metric import Metric
from .program_state import ProgramState
from .runner import ProgramRunner
from .runs import Execution, Outcome, Reference, Step

RAY_EXTRA = "pip install 'dspy-agentgrad[ray]'"
#: DSPy settings a worker takes from the driver (the program's LM when no task_model is given, the adapter).
CARRIED_SETTINGS = ("lm", "adapter", "track_usage")


class Runs(Protocol):
    """What the evaluator calls to run the program and score a run (a :class:`ProgramRunner`, or a proxy)."""

    metric: Metric

    def execute(
        self,
        example: dspy.Example,
        instructions: ProgramState,
        *,
        hints: dict[str, str] | None = None,
        replay: Iterable[Step] = (),
        reference: Reference | None = None,
        only: dict[str, str] | None = None,
    ) -> Execution: ...

    def score(self, example: dspy.Example, execution: Execution, reference: Reference | None = None) -> Outcome: ...


class Executor(Protocol):
    """Places the runs of one :class:`ProgramRunner`."""

    def runs(self, runner: ProgramRunner) -> Runs: ...


class LocalExecutor:
    """Runs in the evaluator's own threads (the default)."""

    def runs(self, runner: ProgramRunner) -> Runs:
        return runner


def import_ray() -> Any:
    """The ``ray`` module, or an ImportError that names the extra to install."""
    try:
        import ray
    except ImportError as missing:
        raise ImportError(f"executor='ray' needs Ray: {RAY_EXTRA}") from missing
    return ray


@dataclass
class RayExecutor:
    """Program runs and metric calls as Ray tasks.

    ``address``: the cluster to join (``"auto"``: the one ``ray start --head`` started on this machine, or a
    ``ray://host:10001`` client address); ``None`` joins a running cluster if there is one, else starts a
    local one. When Ray is already initialized in this process, that cluster is used as it is.
    ``runtime_env`` is passed to ``ray.init`` (e.g. ``{"pip": [...]}`` or ``{"working_dir": "."}`` so that
    workers on other machines can import the program's and the metric's modules); by default the driver's
    ``sys.path`` is given to the workers as ``PYTHONPATH``, which is enough on one machine.
    ``max_task_retries``: how often a run whose worker died is run again elsewhere.
    """

    address: str | None = None
    runtime_env: dict[str, Any] | None = None
    max_task_retries: int = 3
    num_cpus_per_run: float = 1.0
    init_kwargs: dict[str, Any] = field(default_factory=dict)

    def connect(self) -> Any:
        ray = import_ray()
        if ray.is_initialized():
            return ray
        env = self.runtime_env
        if env is None:
            env = {"env_vars": {"PYTHONPATH": os.pathsep.join(os.path.abspath(p or ".") for p in sys.path)}}
        if self.address is not None:
            ray.init(address=self.address, runtime_env=env, **self.init_kwargs)
            return ray
        try:
            ray.init(address="auto", runtime_env=env, **self.init_kwargs)
        except ConnectionError:  # no cluster running: a local one
            ray.init(runtime_env=env, **self.init_kwargs)
        return ray

    def runs(self, runner: ProgramRunner) -> Runs:
        return RayRuns(self, runner)


def executor_of(value: Any) -> Executor:
    """The executor an ``executor=`` option names."""
    if value == "local":
        return LocalExecutor()
    if value == "ray":
        return RayExecutor()
    return value


def check_executor(value: Any) -> None:
    """``executor`` must be ``"local"``, ``"ray"`` or an object with ``runs(runner)`` (:class:`RayExecutor`)."""
    if isinstance(value, str):
        if value not in ("local", "ray"):
            raise ValueError(f"executor must be 'local', 'ray' or an executor object; got {value!r}")
        if value == "ray":
            import_ray()
        return
    if not callable(getattr(value, "runs", None)):
        raise ValueError(
            "executor must be 'local', 'ray' or an executor object such as "
            f"dspy_agentgrad.RayExecutor(address='auto'); got {type(value).__name__}"
        )


class RayRuns:
    """A :class:`ProgramRunner` whose runs and metric calls are Ray tasks; each call waits for its task."""

    def __init__(self, executor: RayExecutor, runner: ProgramRunner):
        if runner.task_budget is not None:
            raise ValueError(
                "max_task_calls and max_task_tokens admit every task-LM call against caps held in this process; "
                "they cannot be enforced on Ray workers: leave them unset with executor='ray', or use "
                "max_metric_calls / max_prompt_tokens"
            )
        self.ray = executor.connect()
        self.metric = runner.metric  # how it is called, for the driver's messages
        settings = {name: dspy.settings.get(name) for name in CARRIED_SETTINGS}
        self._runner = self.ray.put((runner, {k: v for k, v in settings.items() if v is not None}))
        options = {"max_retries": executor.max_task_retries, "num_cpus": executor.num_cpus_per_run}
        self._execute = self.ray.remote(**options)(_remote_execute)
        self._score = self.ray.remote(**options)(_remote_score)

    def execute(self, example: dspy.Example, instructions: ProgramState, **plan: Any) -> Execution:
        """:meth:`ProgramRunner.execute` on a worker (``plan``: its hints, replay and reference)."""
        plan["replay"] = list(plan.get("replay", ()))  # an iterator would not travel
        return self.ray.get(self._execute.remote([self._runner], example, instructions, plan))

    def score(self, example: dspy.Example, execution: Execution, reference: Reference | None = None) -> Outcome:
        return self.ray.get(self._score.remote([self._runner], example, execution, reference))


# ---- the worker side -------------------------------------------------------------------------------------

_WORKER_RUNNERS: dict[str, tuple[ProgramRunner, dict[str, Any]]] = {}
#: Runners a worker process keeps unpickled (one per compile that used it lately).
WORKER_RUNNERS_KEPT = 4


def _worker_runner(boxed: list[Any]) -> tuple[ProgramRunner, dict[str, Any]]:
    """The runner behind the object reference in ``boxed``, unpickled once per worker process."""
    import ray

    ref = boxed[0]
    key = ref.hex()
    if key not in _WORKER_RUNNERS:
        while len(_WORKER_RUNNERS) >= WORKER_RUNNERS_KEPT:
            _WORKER_RUNNERS.pop(next(iter(_WORKER_RUNNERS)))  # the oldest compile's
        _WORKER_RUNNERS[key] = ray.get(ref)
    return _WORKER_RUNNERS[key]


def _remote_execute(boxed, example, instructions, plan) -> Execution:
    runner, settings = _worker_runner(boxed)
    with dspy.context(**settings):
        execution = runner.execute(example, instructions, **plan)
    return portable(execution)


def _remote_score(boxed, example, execution, reference) -> Outcome:
    runner, settings = _worker_runner(boxed)
    with dspy.context(**settings):
        return runner.score(example, execution, reference)


def stand_in(error: BaseException) -> BaseException:
    """An exception that pickles, with the type name and message of ``error`` (and its transience), for one
    that does not: the driver counts it under the same kind."""
    base = TimeoutError if is_transient(error) else Exception
    return type(type(error).__name__, (base,), {})(str(error))


def portable(execution: Execution) -> Execution:
    """``execution`` as it can travel back to the driver: an error that cannot be pickled becomes a
    :func:`stand_in`, the same object everywhere it appears (a predictor's error may be the run's)."""
    from ray import cloudpickle

    errors = [execution.error, *execution.predictor_errors]
    try:
        cloudpickle.dumps(errors)
        return execution
    except Exception:
        pass
    swapped = {id(e): stand_in(e) for e in errors if e is not None}
    execution.error = None if execution.error is None else swapped[id(execution.error)]
    execution.predictor_errors = [swapped[id(e)] for e in execution.predictor_errors]
    return execution
