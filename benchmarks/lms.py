"""Language models for the benchmarks: spec parsing and per-role usage metering."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

import dspy
from dspy.utils.callback import BaseCallback

ROLES = ("task", "prompt")


def parse_spec(spec: str) -> tuple[str, str | None]:
    """``"openai/qwen3-8b@http://localhost:8000/v1"`` -> (model, api_base)."""
    spec = spec.strip()
    if "@" in spec:
        model, base = spec.split("@", 1)
        return model.strip(), base.strip() or None
    return spec, None


def _reasoning_model(model: str) -> bool:
    name = model.split("/")[-1].lower()
    return name.startswith(("gpt-5", "o1", "o3", "o4"))


def make_lm(spec: str, *, fake_rule: Callable | None = None, cache: bool = True, **kwargs: Any) -> dspy.LM:
    """An LM from a spec: ``fake`` (rule-based, needs ``fake_rule``), ``synthetic[:TASK_MS,PROMPT_MS]`` (the
    synthetic benchmark's simulated LM), ``local`` (the embedded model,
    imported lazily) or a litellm model name with an optional ``@api_base``.

    OpenAI reasoning models (gpt-5*, o1/o3/o4) get ``temperature=1.0, max_tokens=32000`` unless given,
    as DSPy requires; an ``@api_base`` without ``OPENAI_API_KEY`` uses the key ``"EMPTY"`` (vLLM/SGLang).
    """
    if spec.startswith("synthetic"):
        return synthetic_lm(spec)
    if spec == "fake":
        if fake_rule is None:
            raise ValueError("the fake LM needs a rule")
        from dspy_agentgrad.testing import fake_lm

        return fake_lm(fake_rule)
    if spec == "local":
        from dspy_agentgrad.embedded_lm import local_lm  # written separately; heavy, so imported lazily

        return local_lm()
    model, base = parse_spec(spec)
    if base:
        kwargs.setdefault("api_base", base)
        kwargs.setdefault("api_key", os.environ.get("OPENAI_API_KEY", "EMPTY"))
    if _reasoning_model(model):
        kwargs.setdefault("temperature", 1.0)
        kwargs.setdefault("max_tokens", 32000)
    return dspy.LM(model, cache=cache, **kwargs)


def synthetic_lm(spec: str = "synthetic") -> dspy.LM:
    """The synthetic benchmark's simulated LM: ``synthetic`` (30 ms per task call, 80 ms per prompt
    call) or ``synthetic:TASK_MS,PROMPT_MS``."""
    from benchmarks.synthetic.world import SyntheticWorld
    from dspy_agentgrad.testing import fake_lm

    task_ms, prompt_ms = 30.0, 80.0
    if ":" in spec:
        try:
            task_ms, prompt_ms = (float(v) for v in spec.split(":", 1)[1].split(","))
        except ValueError as exc:
            raise ValueError(
                f"synthetic LM spec must be 'synthetic' or 'synthetic:TASK_MS,PROMPT_MS'; got {spec!r}"
            ) from exc
    return fake_lm(SyntheticWorld(task_ms / 1000, prompt_ms / 1000), name="fake/synthetic")


def _empty() -> dict[str, int]:
    return {"calls": 0, "errors": 0, "prompt_tokens": 0, "completion_tokens": 0, "cache_hits": 0}


class _RoleCallback(BaseCallback):
    """Counts finished calls of the LM instances it is attached to (copies included)."""

    def __init__(self, meter: UsageMeter, role: str):
        self.meter, self.role = meter, role

    def on_lm_end(self, call_id, outputs, exception=None):
        self.meter._add(self.role, calls=1, errors=int(exception is not None))


class UsageMeter:
    """Thread-safe LM calls and tokens per role ("task" / "prompt").

    ``attach(lm, role)`` adds a callback to the LM instance (``on_lm_end`` counts calls, from any
    thread; ``lm.copy()`` keeps it) and wraps its ``update_history`` to add each call's token usage.
    A call answered from DSPy's cache reports no usage: it is counted in ``cache_hits`` and adds no
    tokens. DSPy's ``track_usage`` is not used because it does not follow calls into worker threads.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self.totals: dict[str, dict[str, int]] = {role: _empty() for role in ROLES}

    def _add(self, role: str, **counts: int) -> None:
        with self._lock:
            bucket = self.totals.setdefault(role, _empty())
            for key, value in counts.items():
                bucket[key] += int(value or 0)

    def attach(self, lm: dspy.BaseLM, role: str) -> dspy.BaseLM:
        lm.callbacks = [c for c in (getattr(lm, "callbacks", None) or []) if not isinstance(c, _RoleCallback)]
        lm.callbacks.append(_RoleCallback(self, role))
        record = type(lm).update_history
        meter = self

        def update_history(entry, _lm=lm):
            usage = entry.get("usage") or {}
            if usage:
                meter._add(
                    role,
                    prompt_tokens=usage.get("prompt_tokens") or 0,
                    completion_tokens=usage.get("completion_tokens") or 0,
                )
            else:
                meter._add(role, cache_hits=1)
            record(_lm, entry)

        lm.update_history = update_history
        return lm

    def snapshot(self) -> dict[str, dict[str, int]]:
        with self._lock:
            return {role: dict(v) for role, v in self.totals.items()}
