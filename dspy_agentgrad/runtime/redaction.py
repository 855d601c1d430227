"""Keeping credentials out of what a run writes, logs or shows an LM.

DSPy's ``save()`` drops ``api_key`` but keeps header values (``extra_headers``); a gateway's 401
may echo the key it rejected, and the error text of a failed run is journaled and, as feedback,
reaches the prompt LM. A :class:`Redactor` replaces the secret values of the run's LMs (the API
key, every header value) and text shaped like a credential (``sk-...``, ``Bearer ...``,
``api_key=...``) with ``[redacted]``.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Iterable, Iterator
from typing import Any

REDACTED = "[redacted]"
#: Settings of an LM holding a credential, or a dict of header values (each treated as one).
SECRET_KWARGS = ("api_key",)
HEADER_KWARGS = ("extra_headers", "headers", "default_headers")
#: Shorter values are not treated as secrets: redacting them would garble ordinary text.
MIN_SECRET_CHARS = 8

_KEY_SHAPED = re.compile(r"\bsk-[A-Za-z0-9_\-]{12,}|\b(?i:bearer)\s+[A-Za-z0-9._~+/=\-]{8,}")
_LABELLED = re.compile(
    r"""(?ix)((?:api[_-]?key|x-api-key|access[_-]?token|secret|password)["']?\s*[:=]\s*["']?)([^\s"',;}]{8,})"""
)


def lm_secrets(lm: Any) -> set[str]:
    """The credential values an LM is configured with: its API key and its header values."""
    kwargs = getattr(lm, "kwargs", None) or {}
    found = {str(kwargs[k]) for k in SECRET_KWARGS if kwargs.get(k)}
    for name in HEADER_KWARGS:
        headers = kwargs.get(name)
        if isinstance(headers, dict):
            found.update(str(v) for v in headers.values() if v)
    return found


class Redactor:
    """Replaces known secret values and key-shaped text with ``[redacted]``."""

    def __init__(self, secrets: Iterable[str] = ()):
        self.secrets = sorted({s for s in secrets if len(s) >= MIN_SECRET_CHARS}, key=len, reverse=True)

    @classmethod
    def for_lms(cls, lms: Iterable[Any]) -> Redactor:
        return cls(secret for lm in lms if lm is not None for secret in lm_secrets(lm))

    def __call__(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, REDACTED)
        text = _KEY_SHAPED.sub(REDACTED, text)
        return _LABELLED.sub(lambda m: m.group(1) + REDACTED, text)

    def data(self, value: Any) -> Any:
        """``value`` (JSON data) with every string redacted."""
        if isinstance(value, str):
            return self(value)
        if isinstance(value, dict):
            return {k: self.data(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.data(v) for v in value]
        return value


class _LogFilter(logging.Filter):
    def __init__(self, redact: Redactor):
        super().__init__()
        self.redact = redact

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg, record.args = self.redact(record.getMessage()), ()
        if record.exc_info:
            record.exc_text = self.redact(logging.Formatter().formatException(record.exc_info))
            record.exc_info = None
        return True


@contextlib.contextmanager
def redacted_logs(redact: Redactor, logger: logging.Logger) -> Iterator[None]:
    """Redact every record ``logger`` emits while the block runs."""
    log_filter = _LogFilter(redact)
    logger.addFilter(log_filter)
    try:
        yield
    finally:
        logger.removeFilter(log_filter)
