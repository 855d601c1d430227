"""``AgentGrad``: the DSPy teleprompter front end (options, checks, budget, persistence, result)."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dspy
from dspy.teleprompt.teleprompt import Teleprompter

from .budget import Budget
from .callbacks import Dispatcher
from .config import AUTO_ROUNDS, AgentGradConfig, auto_budget
from .engine import HintFn, RoundEngine
from .evaluation import Evaluator
from .hints import default_hint
from .jsonable import digest, example_key
from .metric import Metric
from .observers import ProgressBar, StateSnapshot
from .pricing import price_function
from .proposer import Proposer
from .results import AgentGradResult, AttributionReport
from .retries import RetryPolicy
from .store import Memo, atomic_write_json, check_fingerprint
from .tracing import ProgramRunner
from .usage import UsageLedger

logger = logging.getLogger("dspy_agentgrad")

FORMAT_VERSION = 1
_DEFAULTS = AgentGradConfig()


def _check_examples(examples: Any, name: str) -> list[dspy.Example]:
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
    return list(examples)


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
        hint_delivery: str = _DEFAULTS.hint_delivery,
        retry_attempts: int = _DEFAULTS.retry_attempts,
        retry_backoff_s: float = _DEFAULTS.retry_backoff_s,
        callbacks: list[Any] | None = None,
        progress: bool = True,
    ):
        super().__init__()
        self.metric = metric
        self._metric = Metric(metric)
        if hint_fn is not None and not callable(hint_fn):
            raise TypeError(
                "hint_fn must be callable as hint_fn(example, pred_name, prediction, feedback) -> str | None"
            )
        self.hint_fn = hint_fn
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
            hint_delivery=hint_delivery,
            retry_attempts=retry_attempts,
            retry_backoff_s=retry_backoff_s,
            track_stats=track_stats,
        )
        self.config.validate()

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
            ProgramRunner(student, self._metric, task, retry, self.config.hint_delivery),
            memo,
            budget,
            ledger,
            self.config.num_threads,
        )
        price = price_function(prompt) if self.config.max_prompt_cost is not None else None
        proposer = Proposer(prompt, memo, budget, ledger, retry, price)
        predictors = dict(student.named_predictors())
        return RoundEngine(
            self.config,
            evaluator,
            proposer,
            self.hint_fn or default_hint,
            {n: _signature_text(p) for n, p in predictors.items()},
            {n: p.signature.instructions for n, p in predictors.items()},
            trainset,
            valset,
            Dispatcher(list(callbacks)),
        )

    # ---- public API ---------------------------------------------------------------------------
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
        names = _predictor_names(student)
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
            max_calls = auto_budget(
                self.config.auto, len(names), len(trainset), len(valset), self.config.train_batch_size
            )
            max_rounds = max_rounds or AUTO_ROUNDS[self.config.auto]
        initial = {n: p.signature.instructions for n, p in student.named_predictors()}
        resumed = False
        if self.log_dir is not None:
            resumed = check_fingerprint(
                self.log_dir,
                {
                    "format": FORMAT_VERSION,
                    "program": {
                        n: {"signature": _signature_text(p), "instructions": p.signature.instructions}
                        for n, p in student.named_predictors()
                    },
                    "trainset": digest([example_key(e) for e in trainset]),
                    "valset": digest([example_key(e) for e in valset]),
                    "options": self.config.fingerprint(),
                },
            )
        budget = Budget(max_calls, self.config.max_prompt_tokens, self.config.max_prompt_cost)
        options = {**self.config.fingerprint(), "max_rounds": max_rounds, "num_threads": self.config.num_threads}
        started = time.time()

        def snapshot() -> AgentGradResult:
            return AgentGradResult.from_run(
                engine,
                initial_instructions=initial,
                wall_time_s=time.time() - started,
                resumed=resumed,
                options=options,
                log_dir=str(self.log_dir) if self.log_dir else None,
            )

        observers: list[Any] = [ProgressBar(budget, self.progress)]
        if self.log_dir is not None:
            observers.append(StateSnapshot(self.log_dir / "state.json", snapshot))
        engine = self._engine(student, trainset, valset, budget, self.log_dir, observers + self.event_callbacks)
        if resumed:
            logger.info(
                "resuming from %s: %d paid results on disk will be replayed, not paid again",
                self.log_dir,
                engine.evaluator.work.memo.loaded,
            )
        engine.run(max_rounds)
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
        program = student.deepcopy()
        for name, predictor in program.named_predictors():
            predictor.signature = predictor.signature.with_instructions(outcome.final_instructions[name])
        if self.config.track_stats:
            program.detailed_results = outcome
        if self.log_dir is not None:
            atomic_write_json(self.log_dir / "result.json", outcome.to_dict())
            (self.log_dir / "result.md").write_text(outcome.to_markdown(), encoding="utf-8")
            program.save(str(self.log_dir / "optimized_program.json"))
        return program
