"""What a run depends on beyond program, data and options: the metric, the LMs and the optimizer's prompts.

These go into the resume fingerprint (``run.json``), so that resuming a run with another metric,
another task or prompt LM, or another version of the LM-role prompts is refused instead of silently
replaying results that were paid for under the old ones. LM identities hold the model name, the
generation settings and a digest of the endpoint (``api_base``): keys, headers and URLs never reach a file.
"""

from __future__ import annotations

import functools
import inspect
from typing import TYPE_CHECKING, Any

import dspy
from pydantic import BaseModel

from .roles import signatures
from .runtime.jsonable import digest, example_key

if TYPE_CHECKING:
    from .config import AgentGradConfig

FORMAT_VERSION = 2  # 2: the fingerprint holds the metric, the LMs and the prompts

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


def signature_text(predictor: dspy.Predict) -> str:
    """A predictor's input and output field names, as the LM roles and the fingerprint show them."""
    sig = predictor.signature
    return f"inputs: {', '.join(sig.input_fields)}; outputs: {', '.join(sig.output_fields)}"


def run_fingerprint(
    config: AgentGradConfig, metric: Any, lms: tuple[Any, Any], student: dspy.Module, trainset: list, valset: list
) -> dict[str, Any]:
    """What a resumed run must share with the run in its ``log_dir``: program, data, options, metric, the task
    and prompt LMs (``lms``), the adapter and the LM-role prompts."""
    task, prompt = lms
    return {
        "format": FORMAT_VERSION,
        "program": {
            n: {"signature": signature_text(p), "instructions": p.signature.instructions}
            for n, p in student.named_predictors()
        },
        "trainset": digest([example_key(e) for e in trainset]),
        "valset": digest([example_key(e) for e in valset]),
        "options": config.fingerprint(),
        "metric": metric_identity(metric),
        "task_lm": lm_identity(task),
        "prompt_lm": lm_identity(prompt),
        "adapter": adapter_identity(dspy.settings.adapter),
        "prompts": prompts_digest(),
    }


def check_lm(value: Any, option: str) -> None:
    """A clear error for a task or prompt model that is not a DSPy LM (e.g. a model name string)."""
    if value is not None and not isinstance(value, dspy.BaseLM):
        hint = f"; wrap it: {option}=dspy.LM({value!r})" if isinstance(value, str) else ""
        raise TypeError(
            f"{option} must be a dspy.BaseLM (e.g. dspy.LM('openai/gpt-5-mini')); got {type(value).__name__}{hint}"
        )
