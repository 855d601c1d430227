"""Time limits on program runs and metric calls, so that one hung call cannot hold up a round.

A call past its limit is abandoned: the caller stops waiting and counts a ``timeout`` error. Python cannot
stop a thread, so the abandoned call runs on in a daemon thread (it keeps no lock the run needs and does not
keep the process alive); whatever it does after its limit is neither scored nor counted. A call that timed
out is tried once more (:data:`TIMEOUT_ATTEMPTS`), at once, then scored as a failure, like other faults.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

#: Tries of a call that goes past its limit: the first, and one retry.
TIMEOUT_ATTEMPTS = 2


class CallTimeout(TimeoutError):
    """A program run or metric call went past its time limit and was abandoned."""

    def __init__(self, what: str, seconds: float):
        super().__init__(f"{what} took longer than {seconds:g} s and was abandoned")
        self.what = what
        self.seconds = seconds

    def __reduce__(self):  # picklable: a run on a remote worker reports it back
        return (CallTimeout, (self.what, self.seconds))


def within(seconds: float | None, what: str, fn: Callable[[], T]) -> T:
    """``fn()``, or :class:`CallTimeout` once ``seconds`` pass (``None``: no limit, called in this thread).

    ``fn`` runs in a daemon thread under a copy of this thread's context (DSPy's settings overrides, the run
    control and usage tracking travel with it)."""
    if seconds is None:
        return fn()
    context = contextvars.copy_context()
    done = threading.Event()
    box: dict[str, object] = {}

    def target() -> None:
        try:
            box["value"] = context.run(fn)
        except BaseException as error:  # handed to the waiting thread, raised there
            box["error"] = error
        finally:
            done.set()

    threading.Thread(target=target, name=f"agentgrad-{what.replace(' ', '-')}", daemon=True).start()
    if not done.wait(seconds):
        raise CallTimeout(what, seconds)
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]  # type: ignore[return-value]
