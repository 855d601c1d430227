"""TextGrad's prompt-optimization loop (its ``evaluation/prompt_optimization.py``) over a DSPy program.

Per step: a minibatch of training examples runs through the program; each run's loss is built from the
benchmark's metric; ``textgrad.sum(losses).backward()`` passes feedback along the program's steps to
every instruction; ``TextualGradientDescent`` rewrites each instruction that received feedback; the
new program is scored on the validation set and reverted when it scores lower (TextGrad's
``run_validation_revert``). Batches are drawn from the shuffled trainset, epoch after epoch, until the
metric-call budget cannot pay for another step (a minibatch plus a validation pass).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import dspy

from benchmarks.tgd.engine import DSPyEngine, tg
from benchmarks.tgd.graph import loss_of, role_of, steps_of

logger = logging.getLogger(__name__)


@dataclass
class TextGradSettings:
    """Options of the loop (``--options '{"textgrad": {...}}'``)."""

    #: TextGrad's prompt-optimization batch size.
    batch_size: int = 3
    #: Steps when no metric-call budget is given (TextGrad's script: 3 epochs of 4 steps).
    max_steps: int = 12
    #: Reference field of an example shown to the loss (default: the first label field).
    reference_field: str | None = None


@dataclass
class TextGradOutcome:
    program: dspy.Module
    val_score: float
    curve: list[tuple[int, float]]
    details: dict[str, Any] = field(default_factory=dict)


def _with_instructions(program: dspy.Module, instructions: dict[str, Any]) -> dspy.Module:
    copy = program.deepcopy()
    for name, pred in copy.named_predictors():
        pred.signature = pred.signature.with_instructions(instructions[name].value)
    return copy


def _reference(example, field_name: str | None) -> str:
    labels = example.labels()
    if field_name:
        return str(labels.get(field_name, ""))
    return "\n".join(f"{k}: {v}" for k, v in labels.items())[:2000]


def _evaluation_text(result) -> str:
    score = getattr(result, "score", result if not isinstance(result, dict) else result.get("score"))
    feedback = getattr(result, "feedback", None) or (result.get("feedback") if isinstance(result, dict) else None)
    return f"score: {score}" + (f"\nfeedback: {feedback}" if feedback else "")


def optimize(
    program: dspy.Module,
    trainset: list,
    valset: list,
    metric: Callable,
    *,
    evaluate: Callable[[dspy.Module], float],
    task_lm: dspy.BaseLM,
    prompt_lm: dspy.BaseLM,
    budget: int | None,
    spent: Callable[[], int],
    seed: int = 0,
    settings: TextGradSettings | None = None,
) -> TextGradOutcome:
    """Optimize every predictor's instruction of (a copy of) ``program`` with TextGrad.

    ``metric``: the counted metric (its calls are the budget); ``evaluate(program)``: the validation
    score, charged to the same counter; ``spent()``: metric calls so far."""
    settings = settings or TextGradSettings()
    if not trainset or not valset:
        raise ValueError("TextGrad needs a non-empty trainset and valset")
    engine = DSPyEngine(prompt_lm)
    instructions = {
        name: tg.Variable(
            pred.signature.instructions, requires_grad=True, role_description=role_of(name, pred.signature)
        )
        for name, pred in program.named_predictors()
    }
    best = evaluate(_with_instructions(program, instructions))
    curve = [(spent(), best)]
    rng = random.Random(seed)
    order: list = []
    step_cost = min(settings.batch_size, len(trainset)) + len(valset)
    stats = {"steps": 0, "accepted": 0, "reverted": 0, "update_failures": 0, "failed_runs": 0, "unchanged_steps": 0}

    def used() -> int:  # a run that raised scored nothing, but it was a program run all the same
        return spent() + stats["failed_runs"]

    while (budget is None and stats["steps"] < settings.max_steps) or (
        budget is not None and used() + step_cost <= budget
    ):
        if len(order) < settings.batch_size:
            order += rng.sample(trainset, len(trainset))  # a new epoch
        batch, order = order[: settings.batch_size], order[settings.batch_size :]
        stats["steps"] += 1
        current = _with_instructions(program, instructions)
        losses = []
        for example in batch:
            loss = _loss(current, example, metric, task_lm, instructions, engine, settings, stats)
            if loss is not None:
                losses.append(loss)
        if not losses:
            continue
        for var in instructions.values():
            var.reset_gradients()  # TextGrad's optimizer.zero_grad()
        tg.sum(losses).backward(engine)
        previous = {name: var.value for name, var in instructions.items()}
        if not _descend(instructions, engine, stats):
            stats["unchanged_steps"] += 1
            continue
        score = evaluate(_with_instructions(program, instructions))
        if score < best:  # TextGrad's run_validation_revert
            stats["reverted"] += 1
            for name, var in instructions.items():
                var.set_value(previous[name])
        else:
            stats["accepted"] += 1
            best = score
        curve.append((used(), best))
        logger.info("textgrad step %d: val %.4f (best %.4f), %d metric calls", stats["steps"], score, best, used())
    return TextGradOutcome(_with_instructions(program, instructions), best, curve, stats)


def _loss(program, example, metric, task_lm, instructions, engine, settings, stats):
    """One traced run and its TextGrad loss; None when the program raised (nothing to differentiate)."""
    try:
        with dspy.context(lm=task_lm, trace=[]):
            prediction = program(**example.inputs())
            trace = list(dspy.settings.trace)
    except Exception as exc:  # a failing run scores nothing and carries no trace
        stats["failed_runs"] += 1
        logger.warning("textgrad: the program failed on a training example: %s", exc)
        return None
    result = metric(example, prediction, trace)
    steps = steps_of(program, trace)
    if not steps:
        return None
    evaluation = _evaluation_text(result)
    reference = _reference(example, settings.reference_field)
    return loss_of(steps, dict(prediction.items()), reference, evaluation, instructions, engine)


def _descend(instructions: dict[str, Any], engine, stats) -> bool:
    """TextGrad's TGD step on every instruction that received feedback; True when any changed."""
    changed = False
    for var in instructions.values():
        if not var.get_gradient_text().strip():
            continue
        before = var.value
        try:
            tg.TGD(parameters=[var], engine=engine).step()
        except IndexError:  # the LM did not answer between TextGrad's tags
            stats["update_failures"] += 1
            var.set_value(before)
            continue
        changed = changed or var.value != before
    return changed
