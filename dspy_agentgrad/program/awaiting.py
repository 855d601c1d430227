"""Awaiting the user's coroutines (an ``async def`` metric, ``hint_fn`` or ``instruction_proposer``, an async
program) from the optimizer's worker threads, which run no event loop of their own.

A coroutine is run to completion on a fresh event loop: in the calling thread when no loop runs there, else
on a helper thread (the caller may be inside a running loop, e.g. a notebook or an async program calling a
metric), under a copy of the caller's context so DSPy's settings and the run's control reach it.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
from collections.abc import Awaitable
from concurrent.futures import ThreadPoolExecutor
from typing import Any


async def _wait_for(awaitable: Awaitable) -> Any:
    return await awaitable


def resolved(value: Any) -> Any:
    """``value``, or what it evaluates to when it is awaitable (a coroutine, a task, a future)."""
    if not inspect.isawaitable(value):
        return value
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # no loop in this thread: run one here
        return asyncio.run(_wait_for(value))
    context = contextvars.copy_context()
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(context.run, asyncio.run, _wait_for(value)).result()
