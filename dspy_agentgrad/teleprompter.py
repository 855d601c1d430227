"""``AgentGrad``: the DSPy teleprompter front end (options, checks, budget, persistence, result)."""

from __future__ import annotations

import contextlib
import functools
import io
import logging
import random
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import dspy
from dspy.teleprompt.teleprompt import Teleprompter

from .attribution import HintFn
from .budget import Budget
from .callbacks import Dispatcher
from .config import AgentGradConfig, auto_budget, worst_case_calls
from .engine import RoundEngine
from .estimate import Estimate, SampleStats, StartEstimate, build_estimate
from .evaluation import Evaluator
from .hints import default_hint
from .identity import check_lm, lm_identity, metric_identity, prompts_digest
from .instruction_proposer import InstructionProposer
from .jsonable import digest, example_key
from .metric import Metric
from .observers import ProgressBar, StateSnapshot
from .pricing import price_function
from .program_state import apply_state
from .proposer import Proposer
from .report import write_report
from .results import AgentGradResult, AttributionReport
from .retries import RetryPolicy
from .run_lock import LogDirLock
from .store import Memo, atomic_write_json, check_fingerprint
from .tracing import ProgramRunner
from .tracking import MlflowTracker, import_mlflow
from .usage import UsageLedger

logger = logging.getLogger("dspy_agentgrad")

FORMAT_VERSION = 2  # 2: the fingerprint holds the metric, the LMs and the prompts
_DEFAULTS = AgentGradConfig()


def _unencodable_text(value: Any) -> str | None:
    """The first string inside ``value`` that UTF-8 cannot encode (a lone surrogate), if any."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return value
        return None
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple, set)) else ()
    return next((bad for bad in map(_unencodable_text, items) if bad is not None), None)


def _check_examples(examples: Any, name: str) -> list[dspy.Example]:
    if examples is not None and not isinstance(examples, (list, tuple)):
        if isinstance(examples, (str, bytes, dict, dspy.Example)) or not hasattr(examples, "__iter__"):
            raise TypeError(f"{name} must be a list of dspy.Example; got {type(examples).__name__}")
        examples = list(examples)  # a generator or other iterable: read it once, here
    if examples is None or len(examples) == 0:
        raise ValueError(
            f"{name} is empty: AgentGrad needs examples (dspy.Example with .with_inputs(...)) to learn from"
        )
    for i, ex in enumerate(examples):
        if not isinstance(ex, dspy.Example):
            raise TypeError(f"{name}[{i}] is a {type(ex).__name__}, not a dspy.Example")
        try:
            ex.inputs()
        except ValueError:
            raise ValueError(
                f"{name}[{i}] has no input fields: build it with dspy.Example(...).with_inputs('field', ...)"
            ) from None
        for field_name, value in ex.items():
            bad = _unencodable_text(value)
            if bad is not None:
                raise ValueError(
                    f"{name}[{i}] field {field_name!r} holds text that is not valid Unicode (a lone surrogate, "
                    f"as in {bad[:60]!r}); clean it, e.g. text.encode('utf-8', 'replace').decode('utf-8')"
                )
    return list(examples)


def _checked_hint_fn(hint_fn: HintFn) -> HintFn:
    """``hint_fn`` with its result checked: a str, None, or an object with a str ``text`` (a Hint)."""

    def checked(*args: Any, **kwargs: Any) -> Any:
        hint = hint_fn(*args, **kwargs)
        if hint is None or isinstance(hint, str) or isinstance(getattr(hint, "text", None), str):
            return hint
        raise TypeError(
            f"hint_fn returned a {type(hint).__name__} ({str(hint)[:80]!r}); it must return the hint as a str, "
            "or None when it has no hint for this example"
        )

    return checked


def _predictor_names(program: Any) -> list[str]:
    if not isinstance(program, dspy.Module):
        raise TypeError(f"program must be a dspy.Module; got {type(program).__name__}")
    names = [name for name, _ in program.named_predictors()]
    if not names:
        raise ValueError(
            "the program has no predictors (dspy.Predict, dspy.ChainOfThought, ...) "
            "whose instructions AgentGrad could optimize"
        )
    return names


def _check_optimize_predictors(wanted: tuple[str, ...] | None, names: list[str]) -> None:
    unknown = sorted(set(wanted or ()) - set(names))
    if unknown:
        raise ValueError(f"optimize_predictors has unknown names {unknown}; the program's predictors are {names}")


def _embedder(embedder: Any, clustering: str) -> Any:
    """A texts -> vectors function: a user's callable (``dspy.Embedder`` included) or a litellm model name."""
    if clustering != "embedding":
        if embedder is not None:
            raise ValueError("embedder= is used only with clustering='embedding'")
        return None
    if embedder is None:
        raise ValueError(
            "clustering='embedding' needs embedder=: a litellm embedding model name "
            "(e.g. 'openai/text-embedding-3-small'), a dspy.Embedder, or a function list[str] -> vectors"
        )
    return embedder if callable(embedder) else dspy.Embedder(embedder)


def _signature_text(predictor: dspy.Predict) -> str:
    sig = predictor.signature
    return f"inputs: {', '.join(sig.input_fields)}; outputs: {', '.join(sig.output_fields)}"


class AgentGrad(Teleprompter):
    """Prompt optimizer for multi-module DSPy programs (AgentGrad).

    Finds the predictor at fault for each failure by hinting one predictor at a
    time in reverse execution order, turns its corrected output into a
    pseudo-label, extracts a textual gradient per failure, clusters gradients by
    meaning, and rewrites instructions cluster by cluster (largest first),
    keeping a rewrite only if it wins on the cluster and then on validation.
    Option defaults live in :class:`AgentGradConfig`.
    """

    def __init__(
        self,
        metric: Callable,
        *,
        prompt_model: Any = None,
        task_model: Any = None,
        auto: str | None = _DEFAULTS.auto,
        max_metric_calls: int | None = _DEFAULTS.max_metric_calls,
        max_rounds: int | None = _DEFAULTS.max_rounds,
        hint_fn: HintFn | None = None,
        num_threads: int | None = None,
        seed: int = _DEFAULTS.seed,
        log_dir: str | Path | None = None,
        track_stats: bool = _DEFAULTS.track_stats,
        max_score: float = _DEFAULTS.max_score,
        fix_threshold: float | None = _DEFAULTS.fix_threshold,
        max_prompt_tokens: int | None = _DEFAULTS.max_prompt_tokens,
        max_prompt_cost: float | None = _DEFAULTS.max_prompt_cost,
        train_batch_size: int = _DEFAULTS.train_batch_size,
        cluster_schedule: tuple[int, ...] = _DEFAULTS.cluster_schedule,
        clustering: str = _DEFAULTS.clustering,
        target_identification: bool = _DEFAULTS.target_identification,
        agent_supervision: bool = _DEFAULTS.agent_supervision,
        semantic_abstraction: bool = _DEFAULTS.semantic_abstraction,
        leak_check: bool = _DEFAULTS.leak_check,
        label_fields: tuple[str, ...] | None = _DEFAULTS.label_fields,
        cumulative_hints: bool = _DEFAULTS.cumulative_hints,
        failure_score: float = _DEFAULTS.failure_score,
        hint_delivery: str = _DEFAULTS.hint_delivery,
        retry_attempts: int = _DEFAULTS.retry_attempts,
        retry_backoff_s: float = _DEFAULTS.retry_backoff_s,
        resume_despite: tuple[str, ...] = _DEFAULTS.resume_despite,
        val_acceptance: str = _DEFAULTS.val_acceptance,
        eval_chunk_size: int = _DEFAULTS.eval_chunk_size,
        max_field_chars: int = _DEFAULTS.max_field_chars,
        max_instruction_chars: int = _DEFAULTS.max_instruction_chars,
        reuse_calls: bool = _DEFAULTS.reuse_calls,
        speculate: bool = _DEFAULTS.speculate,
        candidates: str = _DEFAULTS.candidates,
        max_demos: int = _DEFAULTS.max_demos,
        callbacks: list[Any] | None = None,
        progress: bool = True,
        optimize_predictors: list[str] | None = _DEFAULTS.optimize_predictors,
        instruction_proposer: InstructionProposer | None = None,
        embedder: Any = None,
        use_mlflow: bool = _DEFAULTS.use_mlflow,
    ):
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
        if instruction_proposer is not None and not callable(instruction_proposer):
            raise TypeError("instruction_proposer must be callable as instruction_proposer(request) -> str | None")
        self.instruction_proposer = instruction_proposer
        self.embedder = _embedder(embedder, clustering)
        self.prompt_model = prompt_model
        self.task_model = task_model
        self.log_dir = Path(log_dir) if log_dir is not None else None
        # not ``self.callbacks``: DSPy would call those as its own callbacks around compile()
        self.event_callbacks = list(callbacks or [])
        Dispatcher(self.event_callbacks)  # checks them now, not mid-run
        self.progress = progress
        self.config = AgentGradConfig(
            auto=auto,
            max_metric_calls=max_metric_calls,
            max_rounds=max_rounds,
            max_prompt_tokens=max_prompt_tokens,
            max_prompt_cost=max_prompt_cost,
            num_threads=_DEFAULTS.num_threads if num_threads is None else num_threads,
            seed=seed,
            max_score=max_score,
            fix_threshold=fix_threshold,
            train_batch_size=train_batch_size,
            cluster_schedule=tuple(cluster_schedule),
            clustering=clustering,
            target_identification=target_identification,
            agent_supervision=agent_supervision,
            semantic_abstraction=semantic_abstraction,
            leak_check=leak_check,
            label_fields=None if label_fields is None else tuple(label_fields),
            cumulative_hints=cumulative_hints,
            failure_score=failure_score,
            hint_delivery=hint_delivery,
            retry_attempts=retry_attempts,
            retry_backoff_s=retry_backoff_s,
            track_stats=track_stats,
            resume_despite=resume_despite,
            optimize_predictors=None if optimize_predictors is None else tuple(optimize_predictors),
            use_mlflow=use_mlflow,
            val_acceptance=val_acceptance,
            eval_chunk_size=eval_chunk_size,
            max_field_chars=max_field_chars,
            max_instruction_chars=max_instruction_chars,
            reuse_calls=reuse_calls,
            speculate=speculate,
            candidates=candidates,
            max_demos=max_demos,
        )
        self.config.validate()
        if use_mlflow:
            import_mlflow()  # fail now, with the install hint, not after paid work

    def get_params(self) -> dict[str, Any]:
        params = {k: v for k, v in self.__dict__.items() if not k.startswith("_") and k != "config"}
        params.update(vars(self.config))
        return params

    # ---- building blocks ------------------------------------------------------------------------
    def _lms(self) -> tuple[Any, Any]:
        task = self.task_model or dspy.settings.lm
        prompt = self.prompt_model or dspy.settings.lm
        if task is None or prompt is None:
            raise ValueError("no LM: pass task_model= and prompt_model=, or call dspy.configure(lm=dspy.LM(...)) first")
        check_lm(task, "the task LM (task_model or dspy.settings.lm)")
        check_lm(prompt, "the prompt LM (prompt_model or dspy.settings.lm)")
        return task, prompt

    def _engine(
        self,
        student: dspy.Module,
        trainset: list[dspy.Example],
        valset: list[dspy.Example],
        budget: Budget,
        log_dir: Path | None,
        callbacks: list[Any] = (),
    ) -> RoundEngine:
        """Wire the parts: program runner and evaluator, proposer, journal, usage, events."""
        task, prompt = self._lms()
        retry = RetryPolicy(self.config.retry_attempts, self.config.retry_backoff_s)
        memo, ledger = Memo(log_dir), UsageLedger()
        evaluator = Evaluator(
            ProgramRunner(
                student,
                self._metric,
                task,
                retry,
                self.config.hint_delivery,
                self.config.max_score,
                self.config.failure_score,
            ),
            memo,
            budget,
            ledger,
            self.config.num_threads,
            self.config.reuse_calls,
        )
        price = price_function(prompt) if self.config.max_prompt_cost is not None else None
        proposer = Proposer(
            prompt,
            memo,
            budget,
            ledger,
            retry,
            price,
            self.config.max_field_chars,
            self.instruction_proposer,
            self.embedder,
        )
        predictors = dict(student.named_predictors())
        hint_fn = (
            _checked_hint_fn(self.hint_fn)
            if self.hint_fn
            else functools.partial(
                default_hint,
                label_fields=self.config.label_fields,
                output_fields={n: list(p.signature.output_fields) for n, p in predictors.items()},
            )
        )
        return RoundEngine(
            self.config,
            evaluator,
            proposer,
            hint_fn,
            {n: _signature_text(p) for n, p in predictors.items()},
            {n: p.signature.instructions for n, p in predictors.items()},
            trainset,
            valset,
            Dispatcher(list(callbacks)),
        )

    def _plan(
        self, student: dspy.Module, trainset: Any, valset: Any
    ) -> tuple[list[str], list[dspy.Example], list[dspy.Example], int | None, int | None]:
        """Checked inputs: predictor names, train and validation sets, metric-call cap and round cap."""
        names = _predictor_names(student)
        _check_optimize_predictors(self.config.optimize_predictors, names)
        trainset = _check_examples(trainset, "trainset")
        if valset is None:
            if len(trainset) < 2:
                raise ValueError(
                    "trainset needs at least 2 examples when no valset is given (a third is held out for validation)"
                )
            shuffled = list(trainset)
            random.Random(self.config.seed).shuffle(shuffled)
            cut = max(1, len(shuffled) // 3)
            valset, trainset = shuffled[:cut], shuffled[cut:]
        valset = _check_examples(valset, "valset")
        max_calls, max_rounds = self.config.max_metric_calls, self.config.max_rounds
        if self.config.auto is not None:
            max_calls = auto_budget(self.config.auto, len(names), len(valset))
        return names, trainset, valset, max_calls, max_rounds

    def _estimator(
        self,
        names: list[str],
        n_train: int,
        n_val: int,
        max_calls: int | None,
        max_rounds: int | None,
        priced: bool = True,
    ):
        """sample stats -> :class:`Estimate` for this run's sizes, caps and models.

        ``priced=False`` leaves USD out: pricing needs litellm's price table, whose import costs
        seconds of CPU, too much for the log line at the start of every compile.
        """
        task, prompt = self._lms()
        prices = {}
        for role, lm in (("task", task), ("prompt", prompt)):
            try:
                with contextlib.redirect_stdout(io.StringIO()):  # litellm prints a banner for unknown models
                    prices[role] = price_function(lm) if priced else None
            except ValueError:
                prices[role] = None
        trainable = set(names) - self.config.frozen(names)
        worst = max_calls
        if max_rounds is not None:
            worst = worst_case_calls(max_rounds, len(names), n_train, n_val, self.config.train_batch_size)
            worst = worst if max_calls is None else min(worst, max_calls)

        def estimate_from(sample: SampleStats) -> Estimate:
            return build_estimate(
                self.config,
                sample,
                predictors=names,
                trainable=trainable,
                n_train=n_train,
                n_val=n_val,
                max_metric_calls=max_calls,
                max_rounds=max_rounds,
                worst_case=worst,
                prices=prices,
            )

        return estimate_from

    # ---- public API ---------------------------------------------------------------------------
    def estimate(
        self,
        program: dspy.Module,
        *,
        trainset: list[dspy.Example],
        valset: list[dspy.Example] | None = None,
        sample_size: int = 8,
    ) -> Estimate:
        """Projected cost of ``compile(program, trainset=..., valset=...)`` before paying for it.

        Runs and attributes ``sample_size`` training examples (the program runs and hinted
        runs of that many examples: task-LM spend, no prompt-LM call) to measure a run's LM
        calls, tokens and seconds, the failure rate, and how blame splits over the
        predictors, then plays the rounds forward (see :mod:`dspy_agentgrad.estimate`).
        """
        names, trainset, valset, max_calls, max_rounds = self._plan(program, trainset, valset)
        sample = random.Random(self.config.seed).sample(trainset, min(sample_size, len(trainset)))
        engine = self._engine(program, sample, sample, Budget(None), None)
        started = time.time()
        report, outcomes = engine.attribute(sample)
        seconds = time.time() - started
        failures = sum(o.score < self.config.max_score for o in outcomes)
        ledger = engine.evaluator.ledger.to_dict()
        runs, reused = engine.evaluator.budget.metric_calls, engine.evaluator.reused
        hinted = runs + reused - len(sample)
        stats = SampleStats(
            runs=runs,
            failure_rate=failures / len(sample),
            task_usage=ledger["task"],
            seconds=seconds,
            hints_per_failure=(runs - len(sample)) / failures if failures else None,
            blame={name: n / failures for name, n in report.counts().items()} if failures else None,
            reuse_rate=reused / hinted if hinted > 0 else 0.0,
        )
        return self._estimator(names, len(trainset), len(valset), max_calls, max_rounds)(stats)

    def attribute(self, program: dspy.Module, examples: list[dspy.Example]) -> AttributionReport:
        """Steps 1-2 only: run ``examples``, then find the predictor at fault for each failure."""
        _predictor_names(program)
        examples = _check_examples(examples, "examples")
        engine = self._engine(program, examples, examples, Budget(self.config.max_metric_calls), None)
        report, _ = engine.attribute(examples)
        return report

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
        names, trainset, valset, max_calls, max_rounds = self._plan(student, trainset, valset)
        with LogDirLock(self.log_dir) if self.log_dir is not None else nullcontext():
            return self._optimize(student, names, trainset, valset, max_calls, max_rounds)

    def _fingerprint(self, student: dspy.Module, trainset: list, valset: list) -> dict:
        """What a resumed run must share with the run in ``log_dir`` (see :mod:`identity`)."""
        task, prompt = self._lms()
        return {
            "format": FORMAT_VERSION,
            "program": {
                n: {"signature": _signature_text(p), "instructions": p.signature.instructions}
                for n, p in student.named_predictors()
            },
            "trainset": digest([example_key(e) for e in trainset]),
            "valset": digest([example_key(e) for e in valset]),
            "options": self.config.fingerprint(),
            "metric": metric_identity(self.metric),
            "task_lm": lm_identity(task),
            "prompt_lm": lm_identity(prompt),
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
        resumed = False
        if self.log_dir is not None:
            fingerprint = self._fingerprint(student, trainset, valset)
            resumed = check_fingerprint(self.log_dir, fingerprint, self.config.resume_despite)
        budget = Budget(max_calls, self.config.max_prompt_tokens, self.config.max_prompt_cost)
        options = {**self.config.fingerprint(), "max_rounds": max_rounds, "num_threads": self.config.num_threads}

        def snapshot() -> AgentGradResult:
            segments = engine.evaluator.work.memo.segment_report()
            return AgentGradResult.from_run(
                engine,
                initial_instructions=initial,
                wall_time_s=sum(seg["wall_time_s"] for seg in segments),
                segments=segments,
                resumed=resumed,
                options=options,
                log_dir=str(self.log_dir) if self.log_dir else None,
            )

        start_estimate = StartEstimate(
            self._estimator(names, len(trainset), len(valset), max_calls, max_rounds, priced="litellm" in sys.modules),
            lambda: engine.evaluator.ledger.by_phase["validate"],
            self.config.max_score,
        )
        observers: list[Any] = [ProgressBar(budget, self.progress), start_estimate]
        if self.config.use_mlflow:
            observers.append(
                MlflowTracker(options, snapshot, lambda r: apply_state(student, r.final_state()))
            )
        if self.log_dir is not None:
            observers.append(StateSnapshot(self.log_dir / "state.json", snapshot))
        engine = self._engine(student, trainset, valset, budget, self.log_dir, observers + self.event_callbacks)
        memo = engine.evaluator.work.memo
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
        if engine.interrupted:
            logger.warning(
                "AgentGrad interrupted: returning the best program so far%s",
                f"; state kept in {self.log_dir}, compile again with the same log_dir to resume"
                if self.log_dir
                else "",
            )
        logger.info(
            "AgentGrad stopped: %s; validation %.4f -> %.4f",
            engine.stop_reason,
            engine.initial_val_score or 0.0,
            engine.best_val_score or 0.0,
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
            (self.log_dir / "result.md").write_text(outcome.to_markdown(), encoding="utf-8")
            program.save(str(self.log_dir / "optimized_program.json"))
            write_report(self.log_dir, outcome)
        return program
