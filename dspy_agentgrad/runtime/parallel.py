"""Ordered parallel map that carries DSPy's per-thread settings into workers.

Results come back in input order, so a run is identical with 1 or N threads.
Unlike ``dspy.Parallel`` it never resubmits stragglers (which would spend
budget twice). Each call of :func:`parallel_map` is one *batch*: work running
inside it sees the same :func:`current_batch` at any thread count (prompt-LM
caps admit a batch's calls together, see :mod:`budget`).

Inside :func:`shared_threads` every batch started from any thread draws its workers from one
pool of slots, so two batches running side by side (the engine overlaps a validation pass with
other work) never have more than ``num_threads`` units of work in flight together. Work started
under :func:`in_background` takes a free slot only when no other work waits for one: it fills
the gaps of the work on the critical path instead of delaying it.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from typing import Any, TypeVar

from dspy.dsp.utils.settings import thread_local_overrides

T = TypeVar("T")
R = TypeVar("R")

_BATCH: contextvars.ContextVar[Any] = contextvars.ContextVar("agentgrad_batch", default=None)
_BACKGROUND: contextvars.ContextVar[bool] = contextvars.ContextVar("agentgrad_background", default=False)


class Slots:
    """``size`` units of work in flight at most; background work yields to waiting foreground work."""

    def __init__(self, size: int):
        self.free = max(1, size)
        self.waiting = 0  # foreground work waiting for a slot
        self._cond = threading.Condition()

    @contextmanager
    def held(self, background: bool) -> Iterator[None]:
        """Hold one of the run's thread slots; background work waits while foreground work does."""
        with self._cond:
            self.waiting += not background
            while self.free == 0 or (background and self.waiting):
                self._cond.wait()
            self.waiting -= not background
            self.free -= 1
        try:
            yield
        finally:
            with self._cond:
                self.free += 1
                self._cond.notify_all()


_SLOTS: contextvars.ContextVar[Slots | None] = contextvars.ContextVar("agentgrad_slots", default=None)


@contextmanager
def shared_threads(num_threads: int) -> Iterator[None]:
    """Batches started in this context (and in threads that copy it) share ``num_threads`` slots."""
    token = _SLOTS.set(Slots(num_threads))
    try:
        yield
    finally:
        _SLOTS.reset(token)


@contextmanager
def in_background() -> Iterator[None]:
    """Batches started here take slots only when no foreground work waits for one."""
    token = _BACKGROUND.set(True)
    try:
        yield
    finally:
        _BACKGROUND.reset(token)


def current_batch() -> Any:
    """The batch the calling work belongs to (None outside :func:`parallel_map`)."""
    return _BATCH.get()


def parallel_map(fn: Callable[[T], R], items: Sequence[T], num_threads: int) -> list[R]:
    """``fn`` over ``items`` within the run's thread slots; results in item order, whatever the thread count."""
    batch = object()
    slots = _SLOTS.get() if _BATCH.get() is None else None  # work inside a batch already holds a slot
    background = _BACKGROUND.get()

    def in_batch(item: T) -> R:
        token = _BATCH.set(batch)
        try:
            with slots.held(background) if slots is not None else nullcontext():
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
