"""Checks of what a user hands ``AgentGrad``: a clear error that says what to fix, before anything is paid."""

from __future__ import annotations

from typing import Any

import dspy

from .core.attribution import HintFn
from .program.awaiting import resolved
from .runtime.jsonable import UnstableValue, stable_jsonable


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
