"""The process-wide cache of loaded llama.cpp models: each model is loaded once per distinct settings, and its
contexts are shared by every engine that uses them."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from .drafting import ReplyDraft
from .grammar_first import llama_class


@dataclass
class _Context:
    llama: Any
    prefix: str | None = None  # the system message of the prompt it last served (its KV cache starts with it)
    busy: bool = False
    last_used: int = 0


class LoadedModel:
    """One llama.cpp model and its contexts, each serving one generation at a time.

    llama.cpp skips the part of a prompt that matches the start of the previous
    prompt *of the same context* (its KV cache). A multi-step DSPy program
    alternates system messages (one per predictor), so with one context every
    call re-reads its whole prompt. A generation therefore takes a free context
    that last served its system message, else a new one (up to ``contexts``),
    else the least recently used free one; a context costs one more load of the
    (memory-mapped) weights plus its KV cache. Generations on different contexts
    run at once (``use(..., at_once=n)``): on a small CPU, two one-thread
    generations side by side finish sooner than the same two one after the other
    on two threads each, and a context's outputs never depend on what runs beside it.
    """

    def __init__(self, llama: Any, load_seconds: float, make: Callable[[], Any] | None = None, contexts: int = 1):
        self.llama = llama
        self.load_seconds = load_seconds
        self._make = make
        self._limit = max(1, contexts) if make is not None else 1
        self._contexts = [_Context(llama)]
        self._changed = threading.Condition()
        self._clock = 0
        self._running = 0

    @contextmanager
    def use(self, prefix: str | None, at_once: int = 1) -> Iterator[Any]:
        """A context for a prompt starting with ``prefix``, held for one generation; waits while ``at_once``
        generations already run or no context is free."""
        with self._changed:
            context = self._changed.wait_for(lambda: self._free_context(prefix, at_once))
            context.busy, context.prefix = True, prefix
            self._running += 1
        try:
            yield context.llama
        finally:
            with self._changed:
                self._clock += 1
                context.busy, context.last_used = False, self._clock
                self._running -= 1
                self._changed.notify_all()

    def _free_context(self, prefix: str | None, at_once: int) -> _Context | None:
        if self._running >= max(1, at_once):
            return None
        free = [c for c in self._contexts if not c.busy]
        for wanted in (prefix, None):  # its own system message first, then a context never used
            for context in free:
                if context.prefix == wanted:
                    return context
        if len(self._contexts) < self._limit:
            assert self._make is not None
            self._contexts.append(_Context(self._make()))
            return self._contexts[-1]
        return min(free, key=lambda c: c.last_used, default=None)


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
