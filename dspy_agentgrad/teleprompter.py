"""``AgentGrad``: the DSPy teleprompter front end (options, checks, budget, persistence, result)."""

from __future__ import annotations

import dataclasses
import inspect
import logging
import random
import sys
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import dspy
from dspy.teleprompt.teleprompt import Teleprompter

from .checks import check_examples, check_optimize_predictors, embedder_function, predictor_names
from .config import AgentGradConfig, auto_budget, check_int
from .core.attribution import HintFn
from .core.engine import RoundEngine
from .core.events import Dispatcher
from .core.state import RunState
from .core.stoppers import Stoppers, check_stop_callbacks
from .identity import adapter_identity, check_lm, lm_identity, metric_identity, prompts_digest
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
from .runtime.jsonable import digest, example_key, to_jsonable
from .runtime.redaction import Redactor, redacted_logs
from .runtime.run_lock import LogDirLock
from .sampling import measure_sample
from .wiring import RunParts, estimator, run_lms, run_parts, run_redactor, signature_text

logger = logging.getLogger("dspy.agentgrad")

FORMAT_VERSION = 2  # 2: the fingerprint holds the metric, the LMs and the prompts


def _alias(name: str, value: Any, gepa_name: str, gepa_value: Any) -> Any:
    """One option given under its name or under dspy.GEPA's name for it; both is an error."""
    if gepa_value is None:
        return value
    if value is not None:
        raise ValueError(f"{name}= and {gepa_name}= are one option ({gepa_name} is dspy.GEPA's name for it); pass one")
    return gepa_value


def _takes_one_argument(fn: Any) -> bool:
    """Whether ``fn`` can be called with one positional argument (True when its signature cannot be read)."""
    if not callable(fn):
        return False
    try:
        inspect.signature(fn).bind(None)
    except TypeError:
        return False
    except ValueError:  # no signature to read (some builtins)
        return True
    return True


class AgentGrad(Teleprompter):
    """Prompt optimizer for multi-module DSPy programs (AgentGrad).

    Finds the predictor at fault for each failure by hinting one predictor at a
    time in reverse execution order, turns its corrected output into a
    pseudo-label, extracts a textual gradient per failure, clusters gradients by
    meaning, and rewrites instructions cluster by cluster (largest first),
    keeping a rewrite only if it wins on the cluster and then on validation.
    Option defaults live in :class:`AgentGradConfig`. ``preset="paper"`` runs the paper's
    procedure (:data:`config.PRESETS` names the options it sets); an option passed explicitly wins.
    """

    def __init__(
        self,
        metric: Callable,
        *,
        prompt_model: Any = None,
        task_model: Any = None,
        hint_fn: HintFn | None = None,
        log_dir: str | Path | None = None,
        callbacks: list[Any] | None = None,
        stop_callbacks: Any = None,
        progress: bool = True,
        verbose: bool = False,
        instruction_proposer: InstructionProposer | None = None,
        embedder: Any = None,
        use_wandb: bool = False,
        wandb_api_key: str | None = None,
        wandb_init_kwargs: dict[str, Any] | None = None,
        reflection_lm: Any = None,
        perfect_score: float | None = None,
        **options: Any,
    ):
        prompt_model = _alias("prompt_model", prompt_model, "reflection_lm", reflection_lm)
        if perfect_score is not None:
            options["max_score"] = _alias("max_score", options.get("max_score"), "perfect_score", perfect_score)
        self.config = AgentGradConfig.from_options(**options)  # the other options: AgentGradConfig's fields
        super().__init__()
        self.metric = metric
        self._metric = Metric(metric)
        if hint_fn is not None and not callable(hint_fn):
            raise TypeError(
                "hint_fn must be callable as hint_fn(example, pred_name, prediction, feedback) -> str | None"
            )
        self.hint_fn = hint_fn
        check_lm(prompt_model, "prompt_model")
        check_lm(task_model, "task_model")
        if instruction_proposer is not None and not _takes_one_argument(instruction_proposer):
            raise TypeError(
                "instruction_proposer must be callable as instruction_proposer(request) -> str | None, with a "
                "dspy_agentgrad.RewriteRequest (dspy.GEPA's instruction_proposer, a function of the candidate, "
                "the reflective dataset and the components to update, is another protocol)"
            )
        self.instruction_proposer = instruction_proposer
        self.embedder = embedder_function(embedder, self.config.clustering)
        self.prompt_model = prompt_model
        self.task_model = task_model
        self.log_dir = Path(log_dir) if log_dir is not None else None
        # not ``self.callbacks``: DSPy would call those as its own callbacks around compile()
        self.event_callbacks = list(callbacks or [])
        Dispatcher(self.event_callbacks)  # checks them now, not mid-run
        self.stop_callbacks = check_stop_callbacks(stop_callbacks)
        self.progress = progress
        self.verbose = verbose
        self.wandb = WandbSettings(use_wandb, wandb_api_key, dict(wandb_init_kwargs or {}))
        self.config.validate()
        if self.config.use_mlflow:
            import_mlflow()  # fail now, with the install hint, not after paid work
        if self.wandb.enabled:
            import_wandb()

    def get_params(self) -> dict[str, Any]:
        """Every option of this optimizer (DSPy's teleprompter protocol), the config's included."""
        params = {k: v for k, v in self.__dict__.items() if not k.startswith("_") and k != "config"}
        params.update(vars(self.config))
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
        check_optimize_predictors(self.config.optimize_predictors, names)
        trainset = check_examples(trainset, "trainset", durable)
        if valset is None:
            if len(trainset) < 2:
                raise ValueError(
                    "trainset needs at least 2 examples when no valset is given (a third is held out for validation)"
                )
            shuffled = list(trainset)
            random.Random(self.config.seed).shuffle(shuffled)
            cut = max(1, len(shuffled) // 3)
            valset, trainset = shuffled[:cut], shuffled[cut:]
            logger.info(
                "no valset given: holding out %d of the %d training examples for validation (a third, shuffled "
                "with seed=%d); AgentGrad learns from the other %d. Pass valset= to choose them.",
                len(valset),
                len(shuffled),
                self.config.seed,
                len(trainset),
            )
        valset = check_examples(valset, "valset", durable)
        max_calls, max_rounds = self.config.max_metric_calls, self.config.max_rounds
        if self.config.auto is not None:
            max_calls = auto_budget(self.config.auto, len(names), len(valset))
        if self.config.max_full_evals is not None:  # as dspy.GEPA counts a full evaluation: train + validation
            max_calls = self.config.max_full_evals * (len(trainset) + len(valset))
        _check_something_can_happen(self.config.val_acceptance, len(valset), max_calls)
        return names, trainset, valset, max_calls, max_rounds

    # ---- public API ---------------------------------------------------------------------------
    def _budget(self, max_calls: int | None) -> Budget:
        """The run's caps: metric calls, prompt-LM tokens and cost, task-LM calls and tokens."""
        config = self.config
        return Budget(
            max_calls, config.max_prompt_tokens, config.max_prompt_cost, config.max_task_calls, config.max_task_tokens
        )

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
        draw = random.Random(self.config.seed)
        sample = draw.sample(trainset, min(sample_size, len(trainset)))
        chosen = {id(example) for example in sample}
        rest = [example for example in trainset if id(example) not in chosen]
        held_out = draw.sample(rest, min(sample_size, len(rest)))
        parts = self._parts(program, self._budget(None), None)  # the metric-call budget is what it projects
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
        parts = self._parts(program, Budget(self.config.max_metric_calls), None)
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

    def _fingerprint(self, student: dspy.Module, trainset: list, valset: list) -> dict:
        """What a resumed run must share with the run in ``log_dir`` (see :mod:`identity`)."""
        task, prompt = self._lms()
        return {
            "format": FORMAT_VERSION,
            "program": {
                n: {"signature": signature_text(p), "instructions": p.signature.instructions}
                for n, p in student.named_predictors()
            },
            "trainset": digest([example_key(e) for e in trainset]),
            "valset": digest([example_key(e) for e in valset]),
            "options": self.config.fingerprint(),
            "metric": metric_identity(self.metric),
            "task_lm": lm_identity(task),
            "prompt_lm": lm_identity(prompt),
            "adapter": adapter_identity(dspy.settings.adapter),
            "prompts": prompts_digest(),
        }

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
            fingerprint = self._fingerprint(student, trainset, valset)
            identity = check_fingerprint(self.log_dir, fingerprint, self.config.resume_despite, _option_defaults())
            resumed, run_id = identity.resumed, identity.run_id
        budget = self._budget(max_calls)
        options = {**self.config.fingerprint(), "max_rounds": max_rounds, "num_threads": self.config.num_threads}
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
                seed=self.config.seed,
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
            (self.config.failure_score, self.config.max_score),
            lambda: parts.evaluator.reused,
        )
        progress = ProgressBar(budget, self.progress, start_estimate.total)
        observers: list[Any] = [
            start_estimate,
            progress,
            RunLog(self.verbose, start_estimate.total),
            Stoppers(self.stop_callbacks),
        ]
        if self.config.use_mlflow or autolog_logs_compiles():
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
        if self.config.track_stats:
            program.detailed_results = outcome
        if self.log_dir is not None:
            atomic_write_json(self.log_dir / "result.json", outcome.to_dict())
            atomic_write_text(self.log_dir / "result.md", outcome.to_markdown())
            self._redactor(student).save(program, self.log_dir / "optimized_program.json")
            write_report(self.log_dir, outcome)
        return program


def _check_something_can_happen(val_acceptance: str, n_val: int, max_calls: int | None) -> None:
    """Refuse (or, for a budget too small to start, warn), before anything is paid, a run whose settings leave it
    nothing it could ever do."""
    if val_acceptance == "robust" and n_val < 2:
        raise ValueError(
            "val_acceptance='robust' keeps a candidate only when its validation gain survives dropping the example "
            "it gains most on: with 1 validation example no candidate can ever be kept, and every metric call would "
            "be wasted. Pass at least 2 validation examples, or val_acceptance='strict'"
        )
    if max_calls is not None and max_calls < n_val:
        logger.warning(
            "max_metric_calls=%d is less than one validation pass (%d validation examples, one metric call each): "
            "the starting program cannot even be scored, so nothing will happen. Raise max_metric_calls to at least "
            "%d, or pass fewer validation examples",
            max_calls,
            n_val,
            n_val,
        )


def _option_defaults() -> dict:
    """Each option's neutral value, as the fingerprint writes it: an option a ``log_dir`` written before it existed
    does not record is no difference at this value."""
    fields = dataclasses.fields(AgentGradConfig)
    return to_jsonable({f.name: f.default for f in fields if f.default is not dataclasses.MISSING})


def _options_signature() -> inspect.Signature:
    """``AgentGrad.__init__``'s own parameters followed by every :class:`AgentGradConfig` field with its
    default, so ``help(AgentGrad)`` and editors that read signatures show each option where it is defined."""
    own = [p for p in inspect.signature(AgentGrad.__init__).parameters.values() if p.kind is not p.VAR_KEYWORD]
    config = [
        inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=f.type)
        for f in dataclasses.fields(AgentGradConfig)
    ]
    return inspect.Signature(own + config)


AgentGrad.__init__.__signature__ = _options_signature()
follow_dspy_autolog()  # an mlflow.dspy.autolog() called before this import would otherwise miss AgentGrad
