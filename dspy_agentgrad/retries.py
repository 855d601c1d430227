"""Retries with backoff, and the classification of errors they rest on.

Shared by program runs and the optimizer's LM roles: transient errors (rate
limits, timeouts, connection and server failures) are retried; parse failures
and other errors are not, and each error is counted by its kind.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

TRANSIENT_NAMES = (
    "RateLimit",
    "Timeout",
    "Connection",
    "ServiceUnavailable",
    "InternalServer",
    "Overloaded",
    "Transport",
    "ServerError",
)


def is_transient(error: BaseException | None) -> bool:
    """Errors worth retrying: rate limits, timeouts, connection and server failures."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, (TimeoutError, ConnectionError)):
            return True
        if any(part in type(error).__name__ for part in TRANSIENT_NAMES):
            return True
        error = error.__cause__ or error.__context__
    return False


def error_kind(error: BaseException) -> str:
    """``transient:<Type>``, ``parse:<Type>`` or ``error:<Type>``: the key errors are counted under."""
    if is_transient(error):
        return "transient:" + type(error).__name__
    if "Parse" in type(error).__name__:
        return "parse:" + type(error).__name__
    return "error:" + type(error).__name__


@dataclass
class RetryPolicy:
    attempts: int = 3
    backoff_s: float = 1.0

    def wait(self, attempt: int) -> None:
        """Sleep before retry number ``attempt`` (exponential backoff)."""
        if self.backoff_s > 0:
            time.sleep(self.backoff_s * (2 ** (attempt - 1)))
