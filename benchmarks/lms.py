"""Language models for the benchmarks: LM specs with per-LM settings, several endpoints per model,
and per-role usage metering.

A spec is ``fake``, ``local``, ``MODEL[@BASE[,BASE...]][?key=value&...]``, a JSON object, or the path
of a JSON file holding one. Keys: ``model``, ``api_base`` (one URL or a list: several servers of one
model, load-balanced with failover through a litellm Router), ``api_key_env`` (the NAME of the
environment variable that holds the key; a key itself is refused), ``temperature``, ``top_p``,
``top_k``, ``max_tokens``, ``extra_body`` (JSON, e.g. a thinking switch), ``num_retries``, ``timeout``.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

import dspy
from dspy.utils.callback import BaseCallback

ROLES = ("task", "prompt")

#: Sampling settings a spec may set, with their types.
SAMPLING = {"temperature": float, "top_p": float, "top_k": int, "max_tokens": int}


class LMSpecError(ValueError):
    """An LM spec that cannot be used as written."""


@dataclass
class LMSpec:
    """One LM as the benchmarks use it: which model, where, with which settings."""

    model: str
    api_bases: list[str] = field(default_factory=list)
    api_key_env: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_tokens: int | None = None
    extra_body: dict[str, Any] = field(default_factory=dict)
    num_retries: int | None = None
    timeout: float | None = None

    def sampling(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in SAMPLING if getattr(self, k) is not None}

    def api_key(self) -> str:
        """The key from ``api_key_env``; without one, ``$OPENAI_API_KEY`` or ``EMPTY`` (local servers)."""
        if self.api_key_env:
            value = os.environ.get(self.api_key_env)
            if not value:
                raise LMSpecError(f"environment variable {self.api_key_env} (api_key_env of {self.model}) is not set")
            return value
        return os.environ.get("OPENAI_API_KEY", "EMPTY")

    def describe(self) -> dict[str, Any]:
        """The spec as written to results files (names the key's variable, never the key)."""
        return {k: v for k, v in asdict(self).items() if v not in (None, [], {})}


_KEYS = {"model", "api_base", "api_key_env", "extra_body", "num_retries", "timeout", *SAMPLING}


def _from_mapping(raw: dict[str, Any], origin: str) -> LMSpec:
    unknown = set(raw) - _KEYS
    if unknown:
        hint = " (put the key in an environment variable and name it with api_key_env)" if "api_key" in unknown else ""
        raise LMSpecError(f"LM spec {origin}: unknown key(s) {sorted(unknown)}{hint}; known: {sorted(_KEYS)}")
    if not raw.get("model"):
        raise LMSpecError(f"LM spec {origin}: 'model' is missing")
    bases = raw.get("api_base") or []
    bases = [bases] if isinstance(bases, str) else list(bases)
    extra = raw.get("extra_body") or {}
    if isinstance(extra, str):
        try:
            extra = json.loads(extra)
        except json.JSONDecodeError as exc:
            raise LMSpecError(f"LM spec {origin}: extra_body is not JSON: {exc}") from exc
    if not isinstance(extra, dict):
        raise LMSpecError(f"LM spec {origin}: extra_body must be a JSON object")
    try:
        values = {k: SAMPLING[k](raw[k]) for k in SAMPLING if raw.get(k) is not None}
        for key, cast in (("num_retries", int), ("timeout", float)):
            if raw.get(key) is not None:
                values[key] = cast(raw[key])
    except (TypeError, ValueError) as exc:
        raise LMSpecError(f"LM spec {origin}: {exc}") from exc
    return LMSpec(
        model=str(raw["model"]).strip(),
        api_bases=[b.strip() for b in bases if b and b.strip()],
        api_key_env=raw.get("api_key_env") or None,
        extra_body=extra,
        **values,
    )


def parse_spec(spec: str) -> LMSpec:
    """``"openai/qwen3-8b@http://h1:8000/v1,http://h2:8000/v1?temperature=0.6&top_k=20"`` -> :class:`LMSpec`;
    also a JSON object or a path to a ``.json`` file."""
    text = spec.strip()
    if text.startswith("{"):
        try:
            return _from_mapping(json.loads(text), "(JSON)")
        except json.JSONDecodeError as exc:
            raise LMSpecError(f"LM spec is not valid JSON: {exc}") from exc
    if text.endswith(".json"):
        path = Path(text).expanduser()
        if not path.exists():
            raise LMSpecError(f"LM spec file {path} does not exist")
        return _from_mapping(json.loads(path.read_text(encoding="utf-8")), str(path))
    text, _, query = text.partition("?")
    model, _, bases = text.partition("@")
    raw: dict[str, Any] = dict(parse_qsl(query, keep_blank_values=False))
    raw.update(model=model, api_base=bases.split(",") if bases else [])
    return _from_mapping(raw, repr(spec))


def _reasoning_model(model: str) -> bool:
    name = model.split("/")[-1].lower()
    return name.startswith(("gpt-5", "o1", "o3", "o4"))


def make_lm(spec: str | LMSpec, *, fake_rule: Callable | None = None, cache: bool = True, **kwargs: Any) -> dspy.LM:
    """An LM from a spec: ``fake`` (rule-based, needs ``fake_rule``), ``synthetic[:TASK_MS,PROMPT_MS]`` (the
    synthetic benchmark's simulated LM), ``local`` (the embedded model, imported lazily) or a model spec
    (see the module docstring).

    OpenAI reasoning models (gpt-5*, o1/o3/o4) get ``temperature=1.0, max_tokens=32000`` unless the
    spec says otherwise, as DSPy requires. Several ``api_base`` URLs give one LM whose calls a litellm
    Router spreads over them (:mod:`benchmarks.lm_router`).
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
    lm_spec = spec if isinstance(spec, LMSpec) else parse_spec(spec)
    settings = {**lm_spec.sampling(), **kwargs}
    if _reasoning_model(lm_spec.model):
        settings.setdefault("temperature", 1.0)
        settings.setdefault("max_tokens", 32000)
    if lm_spec.num_retries is not None:
        settings.setdefault("num_retries", lm_spec.num_retries)
    if len(lm_spec.api_bases) > 1:
        from benchmarks.lm_router import RouterEngine, make_router

        router = make_router(lm_spec.model, lm_spec.api_bases, lm_spec.api_key(), timeout=lm_spec.timeout)
        engine = RouterEngine(router, extra_body=lm_spec.extra_body)
        return dspy.LM(lm_spec.model, engine=engine, cache=cache, **settings)
    if lm_spec.api_bases:
        settings.setdefault("api_base", lm_spec.api_bases[0])
        settings.setdefault("api_key", lm_spec.api_key())
    elif lm_spec.api_key_env:
        settings.setdefault("api_key", lm_spec.api_key())
    if lm_spec.timeout is not None:
        settings.setdefault("timeout", lm_spec.timeout)
    if lm_spec.extra_body:
        settings.setdefault("extra_body", lm_spec.extra_body)
    return dspy.LM(lm_spec.model, cache=cache, **settings)


def describe_spec(spec: str) -> Any:
    """What a results file records about an LM spec: the spec itself for ``fake``/``local``/plain names,
    the parsed settings otherwise (never a key: specs only name the variable that holds it)."""
    if spec in ("fake", "local"):
        return spec
    return parse_spec(spec).describe()


def synthetic_lm(spec: str = "synthetic") -> dspy.LM:
    """The synthetic benchmark's simulated LM: ``synthetic`` (30 ms per task call, 80 ms per prompt
    call) or ``synthetic:TASK_MS,PROMPT_MS``; its wording follows ``SYNTH_REWORD`` as the program does, its
    overreaching fixes ``SYNTH_OVERREACH``, its hint-following ``SYNTH_HINT_RATE``."""
    from benchmarks.synthetic import hint_rate, overreach_share, reword_mode
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
    world = SyntheticWorld(task_ms / 1000, prompt_ms / 1000, reword_mode(), overreach_share(), hint_rate())
    return fake_lm(world, name="fake/synthetic")


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
