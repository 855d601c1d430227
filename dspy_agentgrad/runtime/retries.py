"""Retries with backoff, and the classification of errors they rest on.

Shared by program runs and the optimizer's LM roles: transient errors (rate
limits, timeouts, connection and server failures) are retried; parse failures
and other errors are not, and each error is counted by its kind. A server's
``Retry-After`` is honoured, within a bound.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any

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


#: The longest wait a server's ``Retry-After`` can impose before one retry.
MAX_RETRY_AFTER_S = 120.0


def _header_seconds(headers: Any) -> float | None:
    try:
        millis = headers.get("retry-after-ms") or headers.get("Retry-After-Ms")
        value = headers.get("retry-after") or headers.get("Retry-After")
    except AttributeError:
        return None
    if millis is not None:
        try:
            return float(millis) / 1000
        except ValueError:
            pass
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        try:  # an HTTP date
            return parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError):
            return None


def retry_after_s(error: BaseException | None) -> float | None:
    """The wait a server asked for with ``Retry-After`` (header or the error's ``retry_after``), if any."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        value = getattr(error, "retry_after", None)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        for headers in (getattr(error, "headers", None), getattr(getattr(error, "response", None), "headers", None)):
            found = _header_seconds(headers) if headers is not None else None
            if found is not None:
                return found
        error = error.__cause__ or error.__context__
    return None


@dataclass
class RetryPolicy:
    """How often and how long to retry a transient error (rate limits, timeouts)."""

    attempts: int = 3
    backoff_s: float = 1.0
    max_retry_after_s: float = MAX_RETRY_AFTER_S

    def delay(self, attempt: int, error: BaseException | None = None) -> float:
        """Seconds before retry number ``attempt``: exponential backoff, or longer if the server asked for it
        (``Retry-After``, honoured up to ``max_retry_after_s``)."""
        backoff = self.backoff_s * (2 ** (attempt - 1)) if self.backoff_s > 0 else 0.0
        asked = retry_after_s(error)
        if asked is None:
            return backoff
        return max(backoff, min(max(asked, 0.0), self.max_retry_after_s))

    def wait(self, attempt: int, error: BaseException | None = None) -> None:
        """Sleep before retry number ``attempt`` (see :meth:`delay`)."""
        seconds = self.delay(attempt, error)
        if seconds > 0:
            time.sleep(seconds)
