"""Ordered parallel map that carries DSPy's per-thread settings into workers.

Results come back in input order, so a run is identical with 1 or N threads.
Unlike ``dspy.Parallel`` it never resubmits stragglers (which would spend
budget twice). Each call of :func:`parallel_map` is one *batch*: work running
inside it sees the same :func:`current_batch` at any thread count (prompt-LM
caps admit a batch's calls together, see :mod:`budget`).
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from dspy.dsp.utils.settings import thread_local_overrides

T = TypeVar("T")
R = TypeVar("R")

_BATCH: contextvars.ContextVar[Any] = contextvars.ContextVar("agentgrad_batch", default=None)


def current_batch() -> Any:
    """The batch the calling work belongs to (None outside :func:`parallel_map`)."""
    return _BATCH.get()


def parallel_map(fn: Callable[[T], R], items: Sequence[T], num_threads: int) -> list[R]:
    batch = object()

    def in_batch(item: T) -> R:
        token = _BATCH.set(batch)
        try:
            return fn(item)
        finally:
            _BATCH.reset(token)

    if num_threads <= 1 or len(items) <= 1:
        return [in_batch(item) for item in items]
    parent = dict(thread_local_overrides.get())
    parent.pop("usage_tracker", None)  # each unit of work tracks its own usage

    def run(item: T) -> R:
        token = thread_local_overrides.set({**thread_local_overrides.get(), **parent})
        try:
            return in_batch(item)
        finally:
            thread_local_overrides.reset(token)

    with ThreadPoolExecutor(max_workers=min(num_threads, len(items))) as pool:
        return list(pool.map(run, items))
