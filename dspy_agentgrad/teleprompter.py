"""``AgentGrad``: the DSPy teleprompter front end (options, checks, budget, persistence, result)."""

from __future__ import annotations

import logging
import random
import sys
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import dspy
from dspy.teleprompt.teleprompt import Teleprompter

from .checks import (
    check_alias,
    check_examples,
    check_hint_fn,
    check_instruction_proposer,
    check_optimize_predictors,
    check_something_can_happen,
    embedder_function,
    hold_out_valset,
    predictor_names,
)
from .config import AgentGradConfig, option_defaults, options_help
from .core.attribution import HintFn
from .core.engine import RoundEngine
from .core.events import Dispatcher
from .core.state import RunState
from .core.stoppers import Stoppers, check_stop_callbacks
from .identity import check_lm, run_fingerprint
from .option_checks import check_int
from .program.metric import Metric
from .program.program_state import apply_state
from .reporting.estimate import SAMPLE_SIZE, Estimate, StartEstimate
from .reporting.observers import ProgressBar, RunLog, StateSnapshot
from .reporting.report import write_report
from .reporting.results import AgentGradResult, AttributionReport
from .reporting.tracking import MlflowTracker, autolog_logs_compiles, follow_dspy_autolog, import_mlflow
from .reporting.wandb_tracking import WandbSettings, WandbTracker, import_wandb
from .roles.instruction_proposer import InstructionProposer
from .runtime.atomic_files import atomic_write_json, atomic_write_text
from .runtime.budget import Budget, BudgetExhausted
from .runtime.fingerprint import check_fingerprint
from .runtime.redaction import Redactor, redacted_logs
from .runtime.run_lock import LogDirLock
from .sampling import measure_sample
from .wiring import RunParts, estimator, run_lms, run_parts, run_redactor

logger = logging.getLogger("dspy.agentgrad")


class _ConfigDefault:
    """The default of ``auto``: the config's value, since ``auto=None`` means no ``auto`` budget."""

    def __repr__(self) -> str:
        return "<the config's>"


CONFIG_DEFAULT: Any = _ConfigDefault()


class AgentGrad(Teleprompter):
    """Prompt optimizer for multi-module DSPy programs (AgentGrad).

    Finds the predictor at fault for each failure by hinting one predictor at a
    time in reverse execution order, turns its corrected output into a
    pseudo-label, extracts a textual gradient per failure, clusters gradients by
    meaning, and rewrites instructions cluster by cluster (largest first),
    keeping a rewrite only if it wins on the cluster and then on validation.

    The keywords are dspy.GEPA's (``reflection_lm`` is ``prompt_model``, ``perfect_score`` is
    ``config.scores.max_score``) and this package's own few; every other option is a field of
    ``config=``, an :class:`~dspy_agentgrad.config.AgentGradConfig` built by
    ``AgentGradConfig.from_options(name=value, ...)``. A keyword that is also a config field wins over
    ``config``; ``None`` (for ``auto``: left out) keeps the config's value. ``preset="paper"`` starts from
    the paper's procedure (:data:`~dspy_agentgrad.config.PRESETS`) instead of the defaults. The options,
    group by group (``config.<group>.<field>``):

    """

    def __init__(
        self,
        metric: Callable,
        *,
        auto: str | None = CONFIG_DEFAULT,
        max_metric_calls: int | None = None,
        max_full_evals: int | None = None,
        num_threads: int | None = None,
        seed: int | None = None,
        preset: str | None = None,
        candidates: str | None = None,
        val_acceptance: str | None = None,
        perfect_score: float | None = None,
        prompt_model: Any = None,
        task_model: Any = None,
        reflection_lm: Any = None,
        hint_fn: HintFn | None = None,
        instruction_proposer: InstructionProposer | None = None,
        callbacks: list[Any] | None = None,
        stop_callbacks: Any = None,
        log_dir: str | Path | None = None,
        use_mlflow: bool | None = None,
        use_wandb: bool | None = None,
        config: AgentGradConfig | None = None,
    ):
        prompt_model = check_alias("prompt_model", prompt_model, "reflection_lm", reflection_lm)
        if config is not None and not isinstance(config, AgentGradConfig):
            raise TypeError(f"config must be an AgentGradConfig; got {type(config).__name__}")
        if config is not None and preset is not None:
            raise ValueError(
                "preset= and config= each give a whole config; pass one "
                "(AgentGradConfig.from_options(preset=..., name=value) starts a config from a preset)"
            )
        named = {
            "max_metric_calls": max_metric_calls,
            "max_full_evals": max_full_evals,
            "num_threads": num_threads,
            "seed": seed,
            "candidates": candidates,
            "val_acceptance": val_acceptance,
            "max_score": perfect_score,
            "use_mlflow": use_mlflow,
            "use_wandb": use_wandb,
        }
        given = {name: value for name, value in named.items() if value is not None}
        if auto is not CONFIG_DEFAULT:
            given["auto"] = auto
        base = config if config is not None else AgentGradConfig.from_options(preset)
        self.config = base.with_options(**given)
        self.config.budget.check_bounded()
        super().__init__()
        self.metric = metric
        self._metric = Metric(metric)
        check_hint_fn(hint_fn)
        self.hint_fn = hint_fn
        check_lm(prompt_model, "prompt_model")
        check_lm(task_model, "task_model")
        check_instruction_proposer(instruction_proposer)
        self.instruction_proposer = instruction_proposer
        self.embedder = embedder_function(self.config.abstraction.embedder, self.config.abstraction.clustering)
        self.prompt_model = prompt_model
        self.task_model = task_model
        self.log_dir = Path(log_dir) if log_dir is not None else None
        # not ``self.callbacks``: DSPy would call those as its own callbacks around compile()
        self.event_callbacks = list(callbacks or [])
        Dispatcher(self.event_callbacks)  # checks them now, not mid-run
        self.stop_callbacks = check_stop_callbacks(stop_callbacks)
        output = self.config.output
        self.wandb = WandbSettings(output.use_wandb, output.wandb_api_key, dict(output.wandb_init_kwargs or {}))
        if output.use_mlflow:
            import_mlflow()  # fail now, with the install hint, not after paid work
        if self.wandb.enabled:
            import_wandb()

    def get_params(self) -> dict[str, Any]:
        """Every option of this optimizer (DSPy's teleprompter protocol), the config's included."""
        params = {k: v for k, v in self.__dict__.items() if not k.startswith("_") and k != "config"}
        params.update(self.config.options())
        return params

    # ---- building blocks ------------------------------------------------------------------------
    def _lms(self) -> tuple[Any, Any]:
        return run_lms(self.task_model, self.prompt_model)

    def _redactor(self, student: dspy.Module) -> Redactor:
        return run_redactor(self._lms(), student)

    def _parts(self, student: dspy.Module, budget: Budget, log_dir: Path | None, run_id: str | None = None) -> RunParts:
        """The parts of a run of ``student`` under this optimizer's options (see :func:`wiring.run_parts`)."""
        return run_parts(
            self.config,
            self._metric,
            self._lms(),
            student,
            budget,
            log_dir,
            run_id,
            user_hint_fn=self.hint_fn,
            instruction_proposer=self.instruction_proposer,
            embedder=self.embedder,
        )

    def _engine(
        self,
        parts: RunParts,
        trainset: list[dspy.Example],
        valset: list[dspy.Example],
        state: RunState | None = None,
        callbacks: list[Any] = (),
    ) -> RoundEngine:
        """The round engine over ``parts``, owning ``state`` (a fresh one for the program's instructions by default)."""
        return RoundEngine(
            self.config,
            parts.evaluator,
            parts.proposer,
            parts.budget,
            parts.hint_fn,
            parts.signatures,
            state or RunState(dict(parts.instructions)),
            trainset,
            valset,
            Dispatcher(list(callbacks)),
        )

    def _plan(
        self, student: dspy.Module, trainset: Any, valset: Any, durable: bool = False
    ) -> tuple[list[str], list[dspy.Example], list[dspy.Example], int | None, int | None]:
        """Checked inputs: predictor names, train and validation sets, metric-call cap and round cap.
        ``durable``: the run is kept in ``log_dir``, so the examples' keys must hold in a later process."""
        names = predictor_names(student)
        check_optimize_predictors(self.config.proposals.optimize_predictors, names)
        trainset = check_examples(trainset, "trainset", durable)
        if valset is None:
            trainset, valset = hold_out_valset(trainset, self.config.execution.seed)
        valset = check_examples(valset, "valset", durable)
        max_calls = self.config.budget.metric_calls(len(names), len(trainset), len(valset))
        check_something_can_happen(self.config.judging.val_acceptance, len(valset), max_calls)
        return names, trainset, valset, max_calls, self.config.budget.max_rounds

    # ---- public API ---------------------------------------------------------------------------
    def estimate(
        self,
        program: dspy.Module,
        *,
        trainset: list[dspy.Example],
        valset: list[dspy.Example] | None = None,
        sample_size: int = SAMPLE_SIZE,
    ) -> Estimate:
        """Projected cost of ``compile(program, trainset=..., valset=...)`` before paying for it.

        Pays for one round in small on ``sample_size`` training examples (see
        :mod:`dspy_agentgrad.sampling`): their runs and hinted runs, then one rewrite
        per blamed predictor, run on that predictor's sampled failures, and the winners on as many
        other training examples. That measures a run's LM calls, tokens and seconds, the failure
        rate, how blame splits over the predictors, and how often a rewrite wins and how much it
        fixes, of the sampled failures and of others; the rounds are then played forward (see
        :mod:`dspy_agentgrad.reporting.estimate`). The estimate says what its sample paid.
        """
        check_int("sample_size", sample_size, 1)
        names, trainset, valset, max_calls, max_rounds = self._plan(program, trainset, valset)
        draw = random.Random(self.config.execution.seed)
        sample = draw.sample(trainset, min(sample_size, len(trainset)))
        chosen = {id(example) for example in sample}
        rest = [example for example in trainset if id(example) not in chosen]
        held_out = draw.sample(rest, min(sample_size, len(rest)))
        parts = self._parts(program, self.config.budget.caps(None), None)  # the metric-call budget is what it projects
        try:
            stats = measure_sample(self.config, self._engine(parts, sample, sample), sample, held_out)
        except BudgetExhausted as stop:  # every cap on LM tokens, calls and cost binds its own spending too
            raise BudgetExhausted(
                f"the estimate's sample of {len(sample)} training examples reached a cap before it was measured "
                f"({stop}); what it paid stayed within the caps. Pass a smaller sample_size, or raise the cap"
            ) from None
        return estimator(self.config, self._lms(), names, len(trainset), len(valset), max_calls, max_rounds)(stats)

    def attribute(self, program: dspy.Module, examples: list[dspy.Example]) -> AttributionReport:
        """Steps 1-2 only: run ``examples``, then find the predictor at fault for each failure."""
        predictor_names(program)
        examples = check_examples(examples, "examples")
        parts = self._parts(program, Budget(self.config.budget.max_metric_calls), None)
        return self._engine(parts, examples, examples).attribute(examples).report

    def compile(
        self,
        student: dspy.Module,
        *,
        trainset: list[dspy.Example],
        teacher: Any = None,
        valset: list[dspy.Example] | None = None,
        **kwargs: Any,
    ) -> dspy.Module:
        """Optimize ``student``'s instructions; returns a new program (``student`` is not changed)."""
        if kwargs:
            raise TypeError(f"compile() got unknown options {sorted(kwargs)}; set options on AgentGrad(...)")
        names, trainset, valset, max_calls, max_rounds = self._plan(student, trainset, valset, self.log_dir is not None)
        with (
            LogDirLock(self.log_dir) if self.log_dir is not None else nullcontext(),
            redacted_logs(self._redactor(student), logger),
        ):
            return self._optimize(student, names, trainset, valset, max_calls, max_rounds)

    def _optimize(
        self,
        student: dspy.Module,
        names: list[str],
        trainset: list,
        valset: list,
        max_calls: int | None,
        max_rounds: int | None,
    ) -> dspy.Module:
        initial = {n: p.signature.instructions for n, p in student.named_predictors()}
        resumed, run_id = False, None
        if self.log_dir is not None:
            fingerprint = run_fingerprint(self.config, self.metric, self._lms(), student, trainset, valset)
            identity = check_fingerprint(
                self.log_dir, fingerprint, self.config.output.resume_despite, option_defaults()
            )
            resumed, run_id = identity.resumed, identity.run_id
        budget = self.config.budget.caps(max_calls)
        options = {
            **self.config.fingerprint(),
            "max_rounds": max_rounds,
            "num_threads": self.config.execution.num_threads,
        }
        parts = self._parts(student, budget, self.log_dir, run_id)
        state = RunState(dict(parts.instructions))
        memo = parts.memo

        def snapshot() -> AgentGradResult:
            segments = memo.segment_report()
            return AgentGradResult.from_run(
                state,
                budget=budget,
                usage=parts.evaluator.ledger.to_dict(),
                reused_runs=parts.evaluator.reused,
                program_errors=parts.evaluator.errors,
                prompt_role_failures=parts.proposer.failures,
                phase_calls=parts.evaluator.phase_calls,
                phase_wall_s=parts.evaluator.phase_wall,
                seed=self.config.execution.seed,
                initial_instructions=initial,
                wall_time_s=sum(seg["wall_time_s"] for seg in segments),
                segments=segments,
                resumed=resumed,
                options=options,
                log_dir=str(self.log_dir) if self.log_dir else None,
            )

        start_estimate = StartEstimate(
            estimator(
                self.config,
                self._lms(),
                names,
                len(trainset),
                len(valset),
                max_calls,
                max_rounds,
                priced="litellm" in sys.modules,
            ),
            lambda: parts.evaluator.ledger.by_phase["validate"],
            (self.config.scores.failure_score, self.config.scores.max_score),
            lambda: parts.evaluator.reused,
            lambda: parts.budget.task_spend,
        )
        progress = ProgressBar(budget, self.config.output.progress, start_estimate.total)
        observers: list[Any] = [
            start_estimate,
            progress,
            RunLog(self.config.output.verbose, start_estimate.total),
            Stoppers(self.stop_callbacks),
        ]
        if self.config.output.use_mlflow or autolog_logs_compiles():
            task, prompt = self._lms()
            optimized = lambda r: apply_state(student, r.final_state())  # noqa: E731
            lms = {"task": task, "prompt": prompt}
            observers.append(MlflowTracker(options, lms, snapshot, optimized, self._redactor(student)))
        if self.wandb.enabled:
            observers.append(WandbTracker(self.wandb, options, snapshot))
        if self.log_dir is not None:
            observers.append(StateSnapshot(self.log_dir / "state.json", snapshot))
        engine = self._engine(parts, trainset, valset, state, observers + self.event_callbacks)
        if resumed:
            logger.info(
                "resuming from %s: %d paid results on disk will be replayed, not paid again%s",
                self.log_dir,
                memo.loaded,
                f" ({memo.dropped} damaged journal line(s) skipped)" if memo.dropped else "",
            )
        try:
            engine.run(max_rounds, resumed)
        finally:
            memo.close()
            progress.close()
        if state.interrupted:
            logger.warning(
                "AgentGrad interrupted: returning the best program so far%s",
                f"; state kept in {self.log_dir}, compile again with the same log_dir to resume"
                if self.log_dir
                else "",
            )
        outcome = snapshot()
        unchanged = outcome.why_unchanged()
        if unchanged:
            logger.warning("AgentGrad returns the program unchanged: %s", unchanged)
        program = apply_state(student, outcome.final_state())
        if self.config.output.track_stats:
            program.detailed_results = outcome
        if self.log_dir is not None:
            atomic_write_json(self.log_dir / "result.json", outcome.to_dict())
            atomic_write_text(self.log_dir / "result.md", outcome.to_markdown())
            self._redactor(student).save(program, self.log_dir / "optimized_program.json")
            write_report(self.log_dir, outcome)
        return program


AgentGrad.__doc__ = f"{AgentGrad.__doc__.rstrip()}\n\n{options_help()}\n"
follow_dspy_autolog()  # an mlflow.dspy.autolog() called before this import would otherwise miss AgentGrad
