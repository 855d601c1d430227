"""Retries with backoff, and the classification of errors they rest on.

One retry layer per error, so that retries never multiply:

* an error a ``dspy.LM`` raised (rate limit, timeout, server or transport failure) has already
  been retried by DSPy itself, ``num_retries`` times (3 by default, honouring ``Retry-After``);
  AgentGrad counts it and does not retry it again;
* any other transient error (a retriever, a tool or an LLM-judge metric's own HTTP client timing
  out, refusing the connection or asking to slow down) is retried here, for program runs, metric
  calls and the optimizer's LM roles alike: ``retry_attempts`` tries with exponential backoff,
  honouring a server's ``Retry-After`` within a bound.

Parse failures and other errors are not retried; each error is counted by its kind.

Errors that mean an LM cannot be used as configured (a rejected key, an unknown model) are named
with what to check (:func:`setup_fix`), so a run that meets them on its first calls stops with
:class:`FirstRunsFailed` instead of scoring every run as a failure.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
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


def retried_by_the_lm(error: BaseException | None) -> bool:
    """An error that a ``dspy.LM`` raised after its own retries (DSPy's retryable LM errors), or one caused by it."""
    from dspy.utils.exceptions import is_retryable_lm_error

    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, Exception) and is_retryable_lm_error(error):
            return True
        error = error.__cause__ or error.__context__
    return False


def retry_here(error: BaseException | None) -> bool:
    """Whether AgentGrad retries ``error``: transient, and not already retried by the LM that raised it."""
    return is_transient(error) and not retried_by_the_lm(error)


def error_kind(error: BaseException) -> str:
    """``transient:<Type>``, ``parse:<Type>`` or ``error:<Type>``: the key errors are counted under."""
    if is_transient(error):
        return "transient:" + type(error).__name__
    if "Parse" in type(error).__name__:
        return "parse:" + type(error).__name__
    return "error:" + type(error).__name__


class FirstRunsFailed(RuntimeError):
    """Every run of the first validation pass failed the same way, for a cause no optimization can fix
    (an LM that rejects every call, a metric that always raises, a program bug); the message names it."""


#: LM errors that mean the LM cannot be used as configured, with what to check (matched in the type name).
SETUP_LM_ERRORS = {
    "Auth": "check the API key (api_key= on dspy.LM, or the provider's environment variable) and that it "
    "is valid for this provider and api_base",
    "PermissionDenied": "check that the API key has access to this model",
    "NotFound": "check the model name, and the api_base that serves it",
    "UnsupportedModel": "check the model name, and the api_base that serves it",
    "Billing": "check the account's billing or quota with the provider",
    "NotConfigured": "configure the LM (dspy.configure(lm=...) or task_model=)",
    "Configuration": "check the LM's settings",
}


def setup_fix(error_type: str) -> str | None:
    """What to check when an LM error of type ``error_type`` means the LM cannot be used as configured."""
    return next((fix for part, fix in SETUP_LM_ERRORS.items() if part in error_type), None)


#: The longest wait a server's ``Retry-After`` can impose before one retry.
MAX_RETRY_AFTER_S = 120.0
#: Seconds before the first retry, doubled at each next one. A constant, not an option.
RETRY_BACKOFF_S = 1.0


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
    backoff_s: float = field(default_factory=lambda: RETRY_BACKOFF_S)  # read when built: tests set it to 0
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
