"""The parts an :class:`AgentGrad` run is wired from (program runner and evaluator, proposer, journal, usage,
hints), and the cost estimate for its sizes, caps and models."""

from __future__ import annotations

import contextlib
import functools
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dspy

from .checks import checked_hint_fn
from .config import AgentGradConfig, worst_case_calls
from .core.attribution import HintFn
from .identity import check_lm, signature_text
from .program.evaluation import Evaluator
from .program.executor import executor_of
from .program.hints import default_hint
from .program.metric import Metric
from .program.runner import ProgramRunner
from .reporting.estimate import Estimate, build_estimate
from .reporting.projection import RunShape, RunSoFar, SampleStats
from .roles.instruction_proposer import InstructionProposer
from .roles.proposer import Proposer
from .runtime.budget import Budget
from .runtime.paid_work import AnswerJournal
from .runtime.pricing import price_function
from .runtime.redaction import Redactor
from .runtime.retries import RetryPolicy
from .runtime.store import Memo
from .runtime.usage import UsageLedger


def run_lms(task_model: Any, prompt_model: Any) -> tuple[Any, Any]:
    """The task and prompt LMs of a run (the ones given, else ``dspy.settings.lm``), checked."""
    task = task_model or dspy.settings.lm
    prompt = prompt_model or dspy.settings.lm
    if task is None or prompt is None:
        raise ValueError("no LM: pass task_model= and prompt_model=, or call dspy.configure(lm=dspy.LM(...)) first")
    check_lm(task, "the task LM (task_model or dspy.settings.lm)")
    check_lm(prompt, "the prompt LM (prompt_model or dspy.settings.lm)")
    return task, prompt


def run_redactor(lms: tuple[Any, Any], student: dspy.Module) -> Redactor:
    """Hides the credentials of every LM the run may call (and key-shaped text) in what it keeps."""
    predictor_lms = [getattr(p, "lm", None) for p in student.predictors()]
    return Redactor.for_lms([*lms, dspy.settings.lm, *predictor_lms])


@dataclass
class RunParts:
    """The pieces a run is wired from (see :func:`run_parts`): built before the engine, so the
    result builder and the observers can be given them without reaching through the engine."""

    memo: Memo
    budget: Budget
    evaluator: Evaluator
    proposer: Proposer
    hint_fn: HintFn
    signatures: dict[str, str]
    instructions: dict[str, str]


def run_parts(
    config: AgentGradConfig,
    metric: Metric,
    lms: tuple[Any, Any],
    student: dspy.Module,
    budget: Budget,
    log_dir: Path | None,
    run_id: str | None,
    *,
    user_hint_fn: HintFn | None,
    instruction_proposer: InstructionProposer | None,
    embedder: Any,
) -> RunParts:
    """Wire the parts a run needs: program runner and evaluator, proposer, journal, usage, hints."""
    task, prompt = lms
    retry = RetryPolicy(config.execution.retry_attempts)
    memo, ledger = Memo(log_dir, run_id), UsageLedger()
    runner = ProgramRunner(
        student,
        metric,
        task,
        retry,
        config.attribution.hint_delivery,
        config.scores.max_score,
        config.scores.failure_score,
        run_redactor(lms, student),
        budget,
        config.execution.run_timeout_s,
        config.execution.metric_timeout_s,
        AnswerJournal(memo) if log_dir is not None else None,
    )
    evaluator = Evaluator(
        executor_of(config.execution.executor).runs(runner),
        memo,
        budget,
        ledger,
        config.execution.num_threads,
        config.execution.reuse_calls,
    )
    price = price_function(prompt) if config.budget.max_prompt_cost is not None else None
    proposer = Proposer(
        prompt,
        memo,
        budget,
        ledger,
        retry,
        price,
        instruction_proposer,
        embedder,
    )
    predictors = dict(student.named_predictors())
    hint_fn = (
        checked_hint_fn(user_hint_fn)
        if user_hint_fn
        else functools.partial(
            default_hint,
            label_fields=config.attribution.label_fields,
            output_fields={n: list(p.signature.output_fields) for n, p in predictors.items()},
        )
    )
    return RunParts(
        memo,
        budget,
        evaluator,
        proposer,
        hint_fn,
        {n: signature_text(p) for n, p in predictors.items()},
        {n: p.signature.instructions for n, p in predictors.items()},
    )


def estimator(
    config: AgentGradConfig,
    lms: tuple[Any, Any],
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
    task, prompt = lms
    prices = {}
    for role, lm in (("task", task), ("prompt", prompt)):
        try:
            with contextlib.redirect_stdout(io.StringIO()):  # litellm prints a banner for unknown models
                prices[role] = price_function(lm) if priced else None
        except ValueError:
            prices[role] = None
    trainable = set(names) - config.proposals.frozen(names)
    run = RunShape(names, trainable, n_train, n_val, max_calls, max_rounds, config.budget.cap_task_spend)
    worst = max_calls
    if max_rounds is not None:
        worst = worst_case_calls(
            max_rounds,
            len(names),
            n_train,
            n_val,
            config.attribution.train_batch_size,
            len(config.abstraction.cluster_schedule),
        )
        worst = worst if max_calls is None else min(worst, max_calls)

    def estimate_from(sample: SampleStats, so_far: RunSoFar | None = None) -> Estimate:
        return build_estimate(config, sample, run, worst_case=worst, prices=prices, so_far=so_far)

    return estimate_from
