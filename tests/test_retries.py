"""LM errors: which are transient, and how long a retry waits."""

from __future__ import annotations

import time

from dspy_agentgrad.runtime.retries import RetryPolicy, error_kind, is_transient


class RateLimitError(Exception):
    pass


def test_error_classification():
    assert is_transient(TimeoutError()) and is_transient(ConnectionError()) and is_transient(RateLimitError())
    wrapped = ValueError("wrapper")
    wrapped.__cause__ = RateLimitError("429")
    assert is_transient(wrapped) and error_kind(wrapped) == "transient:ValueError"
    assert error_kind(type("AdapterParseError", (Exception,), {})()) == "parse:AdapterParseError"
    assert error_kind(KeyError("x")) == "error:KeyError" and not is_transient(KeyError("x"))


def test_retry_backoff_doubles(monkeypatch):
    slept = []
    monkeypatch.setattr(time, "sleep", slept.append)
    policy = RetryPolicy(attempts=4, backoff_s=0.5)
    for attempt in (1, 2, 3):
        policy.wait(attempt)
    assert slept == [0.5, 1.0, 2.0]
