"""The process-wide cache of loaded llama.cpp models: each model is loaded once per distinct settings, and its
contexts are shared by every engine that uses them."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from .drafting import ReplyDraft
from .grammar_first import llama_class


class LoadedModel:
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


_LOADED: dict[tuple, LoadedModel] = {}
_LOAD_LOCK = threading.Lock()


def _quiet_llama_logs() -> None:
    """llama.cpp logs context details at warning level on every load; keep errors only."""
    import logging

    try:
        import llama_cpp._logger as llama_logger

        llama_logger.logger.setLevel(logging.ERROR)
    except ImportError:  # pragma: no cover - layout of older llama-cpp-python
        pass


def load_model(
    path: str, settings: dict[str, Any], chat_template: tuple[str, str, str] | None = None, contexts: int = 1
) -> LoadedModel:
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
                return llama_class()(model_path=path, verbose=False, **load, **drafts, **extra)

            llama = make()
            loaded = _LOADED[key] = LoadedModel(llama, time.perf_counter() - start, make, contexts)
        return loaded
