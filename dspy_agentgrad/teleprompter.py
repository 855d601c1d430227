"""``AgentGrad``: the DSPy teleprompter front end (options, checks, budget, persistence, result)."""

from __future__ import annotations

import logging
import random
import time
from pathlib import Path
from typing import Any, Callable

import dspy
from dspy.teleprompt.teleprompt import Teleprompter
from tqdm.auto import tqdm

from .budget import Budget, BudgetExhausted
from .config import AUTO_ROUNDS, AgentGradConfig, auto_budget
from .engine import HintFn, RoundEngine
from .evaluation import Evaluator
from .hints import default_hint
from .jsonable import digest, example_key
from .metric import Metric
from .pricing import price_function
from .proposer import Proposer
from .results import AgentGradResult, AttributionReport
from .store import Memo, atomic_write_json, check_fingerprint
from .tracing import ProgramRunner, RetryPolicy
from .usage import UsageLedger

logger = logging.getLogger("dspy_agentgrad")

FORMAT_VERSION = 1


def _check_examples(examples: Any, name: str) -> list[dspy.Example]:
    if examples is None or len(examples) == 0:
        raise ValueError(f"{name} is empty: AgentGrad needs examples (dspy.Example with .with_inputs(...)) to learn from")
    for i, ex in enumerate(examples):
        if not isinstance(ex, dspy.Example):
            raise TypeError(f"{name}[{i}] is a {type(ex).__name__}, not a dspy.Example")
        try:
            ex.inputs()
        except ValueError:
            raise ValueError(f"{name}[{i}] has no input fields: build it with dspy.Example(...).with_inputs('field', ...)") from None
    return list(examples)


def _predictor_names(program: Any) -> list[str]:
    if not isinstance(program, dspy.Module):
        raise TypeError(f"program must be a dspy.Module; got {type(program).__name__}")
    names = [name for name, _ in program.named_predictors()]
    if not names:
        raise ValueError("the program has no predictors (dspy.Predict, dspy.ChainOfThought, ...) whose instructions AgentGrad could optimize")
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
    """

    def __init__(
        self,
        metric: Callable,
        *,
        prompt_model: Any = None,
        task_model: Any = None,
        auto: str | None = "light",
        max_metric_calls: int | None = None,
        max_rounds: int | None = None,
        hint_fn: HintFn | None = None,
        num_threads: int | None = None,
        seed: int = 0,
        log_dir: str | Path | None = None,
        track_stats: bool = True,
        max_score: float = 1.0,
        fix_threshold: float | None = None,
        max_prompt_tokens: int | None = None,
        max_prompt_cost: float | None = None,
        train_batch_size: int = 16,
        cluster_schedule: tuple[int, ...] = (3, 2, 1),
        clustering: str = "lm",
        target_identification: bool = True,
        agent_supervision: bool = True,
        semantic_abstraction: bool = True,
        leak_check: bool = True,
        retry_attempts: int = 3,
        retry_backoff_s: float = 1.0,
        progress: bool = True,
    ):
        super().__init__()
        self.metric = metric
        self._metric = Metric(metric, max_score)
        if hint_fn is not None and not callable(hint_fn):
            raise TypeError("hint_fn must be callable as hint_fn(example, pred_name, prediction, feedback) -> str | None")
        self.hint_fn = hint_fn
        self.prompt_model = prompt_model
        self.task_model = task_model
        self.log_dir = Path(log_dir) if log_dir is not None else None
        self.progress = progress
        self.config = AgentGradConfig(
            auto=auto, max_metric_calls=max_metric_calls, max_rounds=max_rounds, max_prompt_tokens=max_prompt_tokens,
            max_prompt_cost=max_prompt_cost, num_threads=num_threads if num_threads is not None else 1, seed=seed, max_score=max_score,
            fix_threshold=fix_threshold,
            train_batch_size=train_batch_size, cluster_schedule=tuple(cluster_schedule), clustering=clustering,
            target_identification=target_identification, agent_supervision=agent_supervision,
            semantic_abstraction=semantic_abstraction, leak_check=leak_check, retry_attempts=retry_attempts,
            retry_backoff_s=retry_backoff_s, track_stats=track_stats,
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

    def _parts(self, student: dspy.Module, budget: Budget, log_dir: Path | None):
        task, prompt = self._lms()
        retry = RetryPolicy(self.config.retry_attempts, self.config.retry_backoff_s)
        memo, ledger = Memo(log_dir), UsageLedger()
        evaluator = Evaluator(ProgramRunner(student, self._metric, task, retry), memo, budget, ledger, self.config.num_threads)
        price = price_function(prompt) if self.config.max_prompt_cost is not None else None
        proposer = Proposer(prompt, memo, budget, ledger, retry, price)
        return evaluator, proposer, ledger

    def _engine(self, student, evaluator, proposer, trainset, valset, on_event=lambda phase: None) -> RoundEngine:
        predictors = dict(student.named_predictors())
        return RoundEngine(
            self.config, evaluator, proposer, self.hint_fn or default_hint,
            {n: _signature_text(p) for n, p in predictors.items()},
            {n: p.signature.instructions for n, p in predictors.items()},
            trainset, valset, on_event,
        )

    # ---- public API ---------------------------------------------------------------------------
    def attribute(self, program: dspy.Module, examples: list[dspy.Example]) -> AttributionReport:
        """Steps 1-2 only: run ``examples``, then find the predictor at fault for each failure."""
        _predictor_names(program)
        examples = _check_examples(examples, "examples")
        evaluator, proposer, _ = self._parts(program, Budget(self.config.max_metric_calls), None)
        report, _ = self._engine(program, evaluator, proposer, examples, examples).attribute(examples)
        return report

    def compile(self, student: dspy.Module, *, trainset: list[dspy.Example], teacher: Any = None,
                valset: list[dspy.Example] | None = None, **kwargs: Any) -> dspy.Module:
        """Optimize ``student``'s instructions; returns a new program (``student`` is not changed)."""
        if kwargs:
            raise TypeError(f"compile() got unknown options {sorted(kwargs)}; set options on AgentGrad(...)")
        names = _predictor_names(student)
        trainset = _check_examples(trainset, "trainset")
        if valset is None:
            if len(trainset) < 2:
                raise ValueError("trainset needs at least 2 examples when no valset is given (a third is held out for validation)")
            shuffled = list(trainset)
            random.Random(self.config.seed).shuffle(shuffled)
            cut = max(1, len(shuffled) // 3)
            valset, trainset = shuffled[:cut], shuffled[cut:]
        valset = _check_examples(valset, "valset")
        max_calls, max_rounds = self.config.max_metric_calls, self.config.max_rounds
        if self.config.auto is not None:
            max_calls = auto_budget(self.config.auto, len(names), len(trainset), len(valset), self.config.train_batch_size)
            max_rounds = max_rounds or AUTO_ROUNDS[self.config.auto]
        budget = Budget(max_calls, self.config.max_prompt_tokens, self.config.max_prompt_cost)
        resumed = False
        if self.log_dir is not None:
            resumed = check_fingerprint(self.log_dir, {
                "format": FORMAT_VERSION,
                "program": {n: {"signature": _signature_text(p), "instructions": p.signature.instructions}
                            for n, p in student.named_predictors()},
                "trainset": digest([example_key(e) for e in trainset]),
                "valset": digest([example_key(e) for e in valset]),
                "options": self.config.fingerprint(),
            })
        evaluator, proposer, ledger = self._parts(student, budget, self.log_dir)
        if resumed:
            logger.info("resuming from %s: %d paid results on disk will be replayed, not paid again", self.log_dir, evaluator.memo.loaded)
        started = time.time()
        bar = tqdm(total=max_calls, desc="AgentGrad", unit="metric call", disable=not self.progress)

        def result() -> AgentGradResult:
            return AgentGradResult(
                best_val_score=engine.best_val_score if engine.best_val_score is not None else float("nan"),
                initial_val_score=engine.initial_val_score if engine.initial_val_score is not None else float("nan"),
                final_instructions=dict(engine.instructions),
                initial_instructions={n: p.signature.instructions for n, p in student.named_predictors()},
                candidates=list(engine.candidates), rounds=list(engine.rounds), val_history=list(engine.val_history),
                metric_calls=budget.metric_calls, max_metric_calls=max_calls,
                usage={**ledger.to_dict(), **({"prompt_cost_usd": budget.prompt_cost} if budget.max_prompt_cost else {})},
                program_errors=dict(evaluator.errors), prompt_role_failures=dict(proposer.failures),
                wall_time_s=time.time() - started, stop_reason=stop_reason, interrupted=interrupted, resumed=resumed,
                seed=self.config.seed, options={**self.config.fingerprint(), "max_rounds": max_rounds, "num_threads": self.config.num_threads},
                log_dir=str(self.log_dir) if self.log_dir else None,
            )

        def on_event(phase: str) -> None:
            bar.n = budget.metric_calls
            bar.set_description(f"AgentGrad round {engine.round_index} {phase}")
            if engine.best_val_score is not None:
                bar.set_postfix(best_val=f"{engine.best_val_score:.3f}")
            bar.refresh()
            if self.log_dir is not None:
                atomic_write_json(self.log_dir / "state.json", {"phase": phase, "round": engine.round_index, **result().to_dict()})

        stop_reason, interrupted = "running", False
        engine = self._engine(student, evaluator, proposer, trainset, valset, on_event)
        try:
            engine.validate_start()
            idle_rounds = 0
            while max_rounds is None or engine.round_index < max_rounds:
                spent = budget.metric_calls
                record = engine.run_round()
                if record.failures == 0 and record.batch_size == len(trainset):
                    stop_reason = "no failures left on the training set"
                    break
                idle_rounds = idle_rounds + 1 if budget.metric_calls == spent else 0
                if idle_rounds >= len(self.config.cluster_schedule):
                    stop_reason = f"stalled: {idle_rounds} rounds without a new program run"
                    break
            else:
                stop_reason = f"max_rounds={max_rounds} reached"
        except BudgetExhausted as stop:
            stop_reason = f"budget exhausted ({stop})"
        except KeyboardInterrupt:
            interrupted, stop_reason = True, "interrupted (KeyboardInterrupt)"
            logger.warning("AgentGrad interrupted: returning the best program so far%s",
                           f"; state kept in {self.log_dir}, compile again with the same log_dir to resume" if self.log_dir else "")
        finally:
            bar.n = budget.metric_calls
            bar.close()
        logger.info("AgentGrad stopped: %s; validation %.4f -> %.4f", stop_reason,
                    engine.initial_val_score or 0.0, engine.best_val_score or 0.0)
        outcome = result()
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
