"""Keeping credentials out of what a run writes, logs or shows an LM.

DSPy's ``save()`` drops ``api_key`` but keeps every other setting (header values, ``aws_secret_access_key``,
``azure_ad_token``, a key in an ``api_base`` URL); a gateway's 401 may echo the key it rejected, and the error
text of a failed run is journaled and, as feedback, reaches the prompt LM. Secrets are found by what they
are, not by a list of names: every LM setting whose name says it holds a credential (:func:`credential_name`),
every header value, and the user part of any URL. A :class:`Redactor` replaces them, and text shaped like a
credential (``sk-...``, ``Bearer ...``, ``api_key=...``, ``scheme://user:pass@``), with ``[redacted]``; in
JSON data it also blanks every string under a credential-like key.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from .atomic_files import atomic_write_text

REDACTED = "[redacted]"
#: Settings of an LM holding a dict of header values (each treated as a credential).
HEADER_KWARGS = ("extra_headers", "headers", "default_headers")
#: Words that make a setting's name a credential's (``aws_secret_access_key``, ``azure_ad_token``, ``password``).
CREDENTIAL_WORDS = frozenset(
    {
        "key",
        "apikey",
        "secret",
        "password",
        "passwd",
        "pwd",
        "token",
        "credential",
        "credentials",
        "auth",
        "authorization",
        "cookie",
        "signature",
        "bearer",
    }
)
#: Shorter values are not treated as secrets: redacting them would garble ordinary text.
MIN_SECRET_CHARS = 8

_KEY_SHAPED = re.compile(r"\bsk-[A-Za-z0-9_\-]{12,}|\b(?i:bearer)\s+[A-Za-z0-9._~+/=\-]{8,}")
_URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://)[^/\s@]+@")
_LABELLED = re.compile(
    r"""(?ix)((?:api[_-]?key|x-api-key|access[_-]?token|secret|password)["']?\s*[:=]\s*["']?)([^\s"',;}]{8,})"""
)


def credential_name(name: Any) -> bool:
    """Whether a setting called ``name`` holds a credential: one of its words (split at ``_``, ``-``, ``.`` and
    case changes) is a :data:`CREDENTIAL_WORDS` word (``max_tokens`` counts tokens: plural words do not)."""
    words = re.split(r"[^a-z0-9]+", re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", str(name)).lower())
    return any(word in CREDENTIAL_WORDS for word in words)


def _url_userinfo(text: str) -> set[str]:
    return {match.group(0)[len(match.group(1)) : -1] for match in _URL_USERINFO.finditer(text)}


def _secrets_in(settings: Any, found: set[str], headers: bool = False) -> None:
    """Collect the credentials in LM settings: values under credential-like names, header values, URL users."""
    if isinstance(settings, dict):
        for name, value in settings.items():
            if isinstance(value, (str, int)) and not isinstance(value, bool) and (headers or credential_name(name)):
                found.add(str(value))
            _secrets_in(value, found, headers=name in HEADER_KWARGS)
    elif isinstance(settings, (list, tuple)):
        for value in settings:
            _secrets_in(value, found)
    elif isinstance(settings, str):
        found.update(_url_userinfo(settings))


def lm_secrets(lm: Any) -> set[str]:
    """The credential values an LM is configured with: every setting whose name says it is one (``api_key``,
    ``aws_secret_access_key``, ``azure_ad_token``, ...), every header value, the user part of every URL."""
    found: set[str] = set()
    _secrets_in(dict(getattr(lm, "kwargs", None) or {}), found)
    for name in ("api_key", "api_base", "base_url"):  # some LM classes keep these as attributes
        value = getattr(lm, name, None)
        if isinstance(value, str):
            _secrets_in({name: value}, found)
    return {secret for secret in found if secret}


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
        text = _URL_USERINFO.sub(lambda m: m.group(1) + REDACTED + "@", text)
        return _LABELLED.sub(lambda m: m.group(1) + REDACTED, text)

    def data(self, value: Any, lm: bool = False, secret: bool = False) -> Any:
        """``value`` (JSON data) with every string redacted; in the settings of an LM (under a key ``lm``, as
        ``program.save()`` writes them) every value under a credential-like name or in a header dict whole."""
        if isinstance(value, str):
            return REDACTED if secret and value else self(value)
        if secret and isinstance(value, (int, float)) and not isinstance(value, bool):
            return REDACTED
        if isinstance(value, dict):
            return {
                k: self.data(v, lm or k == "lm", secret or (lm and (k in HEADER_KWARGS or credential_name(k))))
                for k, v in value.items()
            }
        if isinstance(value, list):
            return [self.data(v, lm, secret) for v in value]
        return value

    def save(self, program: Any, path: Path) -> None:
        """``program.save(path)`` without credentials, written atomically: DSPy keeps header values and every
        setting but ``api_key``, so the state is saved in a private temporary folder and redacted first."""
        with tempfile.TemporaryDirectory() as scratch:
            raw = Path(scratch) / "program.json"
            program.save(str(raw))
            state = json.loads(raw.read_text(encoding="utf-8"))
        atomic_write_text(path, json.dumps(self.data(state), indent=2, ensure_ascii=False))


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
