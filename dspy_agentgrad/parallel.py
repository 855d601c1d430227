"""Ordered parallel map that carries DSPy's per-thread settings into workers.

Results come back in input order, so a run is identical with 1 or N threads.
Unlike ``dspy.Parallel`` it never resubmits stragglers (which would spend
budget twice).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from dspy.dsp.utils.settings import thread_local_overrides

T = TypeVar("T")
R = TypeVar("R")


def parallel_map(fn: Callable[[T], R], items: Sequence[T], num_threads: int) -> list[R]:
    if num_threads <= 1 or len(items) <= 1:
        return [fn(item) for item in items]
    parent = dict(thread_local_overrides.get())
    parent.pop("usage_tracker", None)  # each unit of work tracks its own usage

    def run(item: T) -> R:
        token = thread_local_overrides.set({**thread_local_overrides.get(), **parent})
        try:
            return fn(item)
        finally:
            thread_local_overrides.reset(token)

    with ThreadPoolExecutor(max_workers=min(num_threads, len(items))) as pool:
        return list(pool.map(run, items))
