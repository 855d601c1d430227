"""Checks of what a user hands ``AgentGrad``: a clear error that says what to fix, before anything is paid."""

from __future__ import annotations

import inspect
import logging
import random
from typing import Any

import dspy

from .core.attribution import HintFn
from .program.awaiting import resolved
from .runtime.jsonable import UnstableValue, stable_jsonable

logger = logging.getLogger("dspy.agentgrad")


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


def check_examples(examples: Any, name: str, durable: bool = False) -> list[dspy.Example]:
    """``examples`` as a list of usable ``dspy.Example``; otherwise an error that says how to build them.

    ``durable``: the examples' keys must mean the same in a later process (a ``log_dir`` is resumed), so a value
    whose text is a memory address is refused. Within one process that text is stable (the examples live for
    the whole run), so without a ``log_dir`` such a value is keyed by it."""
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
            try:
                if durable:
                    stable_jsonable(value)
            except UnstableValue as exc:
                raise UnstableValue(
                    f"{name}[{i}] field {field_name!r} holds a {exc} object whose text differs in every process "
                    "(its repr is a memory address), so a run in log_dir could not be resumed: store plain data "
                    "there (str, numbers, lists, dicts, sets), give the class a __str__ that describes its value, "
                    "or run without log_dir"
                ) from None
    return list(examples)


def checked_hint_fn(hint_fn: HintFn) -> HintFn:
    """``hint_fn`` with its result checked: a str, None, or an object with a str ``text`` (a Hint)."""

    def checked(*args: Any, **kwargs: Any) -> Any:
        hint = resolved(hint_fn(*args, **kwargs))  # an async hint_fn is awaited
        if hint is None or isinstance(hint, str) or isinstance(getattr(hint, "text", None), str):
            return hint
        raise TypeError(
            f"hint_fn returned a {type(hint).__name__} ({str(hint)[:80]!r}); it must return the hint as a str, "
            "or None when it has no hint for this example"
        )

    return checked


def predictor_names(program: Any) -> list[str]:
    """The names of ``program``'s predictors: what AgentGrad can rewrite (an error when there is none)."""
    if not isinstance(program, dspy.Module):
        raise TypeError(f"program must be a dspy.Module; got {type(program).__name__}")
    names = [name for name, _ in program.named_predictors()]
    if not names:
        raise ValueError(
            "the program has no predictors (dspy.Predict, dspy.ChainOfThought, ...) "
            "whose instructions AgentGrad could optimize"
        )
    return names


def check_optimize_predictors(wanted: tuple[str, ...] | None, names: list[str]) -> None:
    """A typo in ``optimize_predictors`` is an error, not a silently frozen program."""
    unknown = sorted(set(wanted or ()) - set(names))
    if unknown:
        raise ValueError(f"optimize_predictors has unknown names {unknown}; the program's predictors are {names}")


def embedder_function(embedder: Any, clustering: str) -> Any:
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


def hold_out_valset(trainset: list[dspy.Example], seed: int) -> tuple[list[dspy.Example], list[dspy.Example]]:
    """Train and validation sets when no valset is given: a third of ``trainset``, shuffled with ``seed``."""
    if len(trainset) < 2:
        raise ValueError(
            "trainset needs at least 2 examples when no valset is given (a third is held out for validation)"
        )
    shuffled = list(trainset)
    random.Random(seed).shuffle(shuffled)
    cut = max(1, len(shuffled) // 3)
    valset, trainset = shuffled[:cut], shuffled[cut:]
    logger.info(
        "no valset given: holding out %d of the %d training examples for validation (a third, shuffled "
        "with seed=%d); AgentGrad learns from the other %d. Pass valset= to choose them.",
        len(valset),
        len(shuffled),
        seed,
        len(trainset),
    )
    return trainset, valset


def check_alias(name: str, value: Any, gepa_name: str, gepa_value: Any) -> Any:
    """One option given under its name or under dspy.GEPA's name for it; both is an error."""
    if gepa_value is None:
        return value
    if value is not None:
        raise ValueError(f"{name}= and {gepa_name}= are one option ({gepa_name} is dspy.GEPA's name for it); pass one")
    return gepa_value


def check_hint_fn(hint_fn: Any) -> None:
    """``hint_fn`` must be callable (its replies are checked as they come, by :func:`checked_hint_fn`)."""
    if hint_fn is not None and not callable(hint_fn):
        raise TypeError("hint_fn must be callable as hint_fn(example, pred_name, prediction, feedback) -> str | None")


def check_instruction_proposer(proposer: Any) -> None:
    """``instruction_proposer`` must take one argument, a :class:`RewriteRequest`."""
    if proposer is not None and not _takes_one_argument(proposer):
        raise TypeError(
            "instruction_proposer must be callable as instruction_proposer(request) -> str | None, with a "
            "dspy_agentgrad.RewriteRequest (dspy.GEPA's instruction_proposer, a function of the candidate, "
            "the reflective dataset and the components to update, is another protocol)"
        )


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


def check_something_can_happen(val_acceptance: str, n_val: int, max_calls: int | None) -> None:
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
