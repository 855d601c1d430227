"""The one path for work that costs money: look it up, pay once, journal it.

Program runs (metric calls) and prompt-LM calls both go through
:class:`PaidWork`. A unit of work has a key naming what determines it. Asked for a
key, ``settle`` returns the result already settled in this run, or waits for the
thread that is settling it, or takes it from the journal of an earlier (killed)
run, or pays for it, and appends what was paid to the journal at once. Exactly one
caller per key sees ``new=True``: the one that should count its usage and charge
it, so a resumed run accounts for exactly what an uninterrupted run accounts for.
The journal is synced to disk once the last settlement in flight is done.

A program run is many task-LM calls: :class:`AnswerJournal` journals each answer the moment it
arrives, before the program does anything with it, so a kill in the middle of a run (or of runs
made ahead) loses only the answers in flight; the resumed run makes the run again and gets the
journaled answers back.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar

from .store import ANSWER_KEY_PREFIX, Memo

T = TypeVar("T")


class PaidWork(Generic[T]):
    """Work that costs money, done once per key: looked up, awaited, or paid and journaled."""

    def __init__(
        self,
        memo: Memo,
        encode: Callable[[T], Any],
        decode: Callable[[Any], T],
        replayed: Callable[[T], None] | None = None,
    ):
        """``replayed`` is told of each result taken from the journal (paid by an earlier compile), so that
        it counts against the caps as when it was paid."""
        self.memo = memo
        self.encode = encode
        self.decode = decode
        self.replayed = replayed
        self._settled: dict[str, T] = {}
        self._in_flight: dict[str, threading.Event] = {}
        self._lock = threading.Lock()

    def pending(self, keys: Iterable[str]) -> list[str]:
        """The distinct keys, in order, that no thread has settled or started in this run."""
        out: list[str] = []
        with self._lock:
            for key in keys:
                if key not in self._settled and key not in self._in_flight and key not in out:
                    out.append(key)
        return out

    def settle(self, key: str, pay: Callable[[], T]) -> tuple[T, bool]:
        """The result for ``key`` and whether this call settled it (``new``)."""
        with self._lock:
            if key in self._settled:
                return self._settled[key], False
            event = self._in_flight.get(key)
            if event is None:
                self._in_flight[key] = threading.Event()
        if event is not None:
            event.wait()
            with self._lock:
                if key in self._settled:
                    return self._settled[key], False
            return self.settle(key, pay)  # the first thread failed: try again
        try:
            stored = self.memo.get(key)
            if stored is not None:
                value = self.decode(stored)
                if self.replayed is not None:
                    self.replayed(value)
            else:
                value = pay()
                self.memo.put(key, self.encode(value))
            with self._lock:
                self._settled[key] = value
        finally:
            with self._lock:
                self._in_flight.pop(key).set()
                drained = not self._in_flight
            if drained:
                self.memo.sync()  # group commit: one fsync per settled batch, not one per record
        return value, True


class AnswerJournal:
    """Task-LM answers journaled as they arrive, read back by the run that asks for them again after a resume."""

    def __init__(self, memo: Memo):
        self.memo = memo

    def take(self, key: str) -> dict | None:
        """The answer journaled by an earlier compile for ``key`` (outputs and usage), handed out once."""
        return self.memo.get(ANSWER_KEY_PREFIX + key)

    def keep(self, key: str, outputs: dict[str, Any], usage: dict[str, int]) -> None:
        """Journal an answer just paid for, before anything is done with it."""
        self.memo.put(ANSWER_KEY_PREFIX + key, {"outputs": outputs, "usage": dict(usage)})
