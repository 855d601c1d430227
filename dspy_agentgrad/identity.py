"""What a run depends on beyond program, data and options: the metric, the LMs and the optimizer's prompts.

These go into the resume fingerprint (``run.json``), so that resuming a run with another metric,
another task or prompt LM, or another version of the LM-role prompts is refused instead of silently
replaying results that were paid for under the old ones. LM identities hold the model name, the
generation settings and a digest of the endpoint (``api_base``): keys, headers and URLs never reach a file.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import dspy
from pydantic import BaseModel

from .roles import signatures
from .runtime.fingerprint import OVERRIDABLE
from .runtime.jsonable import digest

#: Settings of ``dspy.LM`` that change what the model generates (an allowlist: nothing else is written).
GENERATION_KEYS = (
    "temperature",
    "max_tokens",
    "max_completion_tokens",
    "top_p",
    "top_k",
    "n",
    "stop",
    "seed",
    "reasoning_effort",
    "frequency_penalty",
    "presence_penalty",
    "response_format",
    "rollout_id",
)

#: Settings of ``dspy.LM`` naming the server it talks to.
ENDPOINT_KEYS = ("api_base", "base_url")


def _source_digest(obj: Any) -> str | None:
    try:
        return digest(inspect.getsource(obj))
    except (OSError, TypeError):
        return None  # built-ins, C functions, code typed at a REPL: the name alone identifies them


#: Attributes under which a callable object (a counting or caching wrapper) usually keeps the metric it wraps.
WRAPPED_ATTRIBUTES = ("__wrapped__", "metric", "fn", "func")


def metric_identity(metric: Any) -> dict[str, Any]:
    """Qualified name of the metric (or of its class) and a digest of its source; for a wrapper object,
    the identity of the metric it wraps too."""
    target = metric.func if isinstance(metric, functools.partial) else metric
    wrapped = None
    if not inspect.isroutine(target):
        inner = next((getattr(target, a) for a in WRAPPED_ATTRIBUTES if callable(getattr(target, a, None))), None)
        wrapped = None if inner is None or inner is target else metric_identity(inner)
        target = type(target)
    name = f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', type(target).__name__)}"
    identity = {"name": name, "source": _source_digest(target)}
    if wrapped is not None:
        identity["wraps"] = wrapped
    return identity


def lm_identity(lm: Any) -> dict[str, Any]:
    """The model name, LM class, generation settings and a digest of the endpoint of ``lm``; never credentials."""
    kwargs = getattr(lm, "kwargs", None) or {}
    settings = {k: kwargs[k] for k in GENERATION_KEYS if kwargs.get(k) is not None}
    endpoint = next((kwargs[k] for k in ENDPOINT_KEYS if kwargs.get(k)), None)
    return {
        "class": type(lm).__qualname__,
        "model": getattr(lm, "model", None),
        "settings": settings,
        "endpoint": None if endpoint is None else digest(str(endpoint)),
    }


def adapter_identity(adapter: Any) -> dict[str, Any]:
    """The class and plain settings of the adapter that formats every prompt (``None``: DSPy's ``ChatAdapter()``)."""
    adapter = dspy.ChatAdapter() if adapter is None else adapter
    config = {
        k: v
        for k, v in sorted(vars(adapter).items())
        if not k.startswith("_") and (v is None or isinstance(v, (str, bool, int, float)))
    }
    return {"class": type(adapter).__qualname__, "config": config}


#: Where the role signatures lived when this digest was defined; a type's text names that module, so moving
#: the module (as into ``roles/``) does not change the digest and an older ``log_dir`` still resumes.
SIGNATURES_HOME = "dspy_agentgrad.signatures"


def prompts_digest() -> str:
    """A digest of every LM-role prompt in :mod:`dspy_agentgrad.roles.signatures` (instructions and fields)."""
    found = {}
    for name, value in sorted(vars(signatures).items()):
        if isinstance(value, type) and issubclass(value, dspy.Signature) and value is not dspy.Signature:
            fields = {
                field: {
                    "desc": info.json_schema_extra.get("desc"),
                    "type": str(info.annotation).replace(signatures.__name__, SIGNATURES_HOME),
                }
                for field, info in value.fields.items()
            }
            found[name] = {"instructions": value.instructions, "fields": fields}
        elif isinstance(value, type) and issubclass(value, BaseModel) and value is not BaseModel:
            found[name] = value.model_json_schema()  # structured output types carry prompt text too
    return digest(found)


def check_lm(value: Any, option: str) -> None:
    """A clear error for a task or prompt model that is not a DSPy LM (e.g. a model name string)."""
    if value is not None and not isinstance(value, dspy.BaseLM):
        hint = f"; wrap it: {option}=dspy.LM({value!r})" if isinstance(value, str) else ""
        raise TypeError(
            f"{option} must be a dspy.BaseLM (e.g. dspy.LM('openai/gpt-5-mini')); got {type(value).__name__}{hint}"
        )


def check_resume_despite(parts: Any) -> tuple[str, ...]:
    """``resume_despite`` as a tuple of known parts: a typo must not silently skip a check."""
    parts = (parts,) if isinstance(parts, str) else tuple(parts or ())
    unknown = [p for p in parts if p not in OVERRIDABLE]
    if unknown:
        raise ValueError(f"resume_despite accepts {', '.join(OVERRIDABLE)}; got {', '.join(map(repr, unknown))}")
    return parts
