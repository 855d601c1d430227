"""Turning DSPy values into JSON and stable hashes (for caches, state files and keys).

A key must be the same in every process: sets are written sorted (their iteration order
changes with the interpreter's hash seed), and a value with no stable text (an object whose
repr is its memory address) is refused by :func:`stable_jsonable` rather than hashed.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

#: A memory address in a repr (``<Foo object at 0x7f...>``): text that differs in every process.
_ADDRESS = re.compile(r"0x[0-9a-fA-F]{6,}")


class UnstableValue(TypeError):
    """A value with no encoding that is the same in every process."""


def _sort_key(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def _convert(value: Any, strict: bool) -> Any:
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, dict):
        return {str(k): _convert(v, strict) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_convert(v, strict) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((_convert(v, strict) for v in value), key=_sort_key)
    if hasattr(value, "model_dump"):
        return _convert(value.model_dump(), strict)
    if hasattr(value, "toDict"):
        return _convert(value.toDict(), strict)
    if hasattr(value, "tolist"):  # numpy scalars and arrays
        return _convert(value.tolist(), strict)
    text = str(value)
    if strict and _ADDRESS.search(text):
        raise UnstableValue(type(value).__qualname__)
    return text


def to_jsonable(value: Any) -> Any:
    """``value`` as plain JSON types (sets sorted, unknown objects as their text), so results, events and
    journal lines always serialize."""
    return _convert(value, strict=False)


def stable_jsonable(value: Any) -> Any:
    """Like :func:`to_jsonable`, but raise :class:`UnstableValue` for a value whose text holds a memory address."""
    return _convert(value, strict=True)


def digest(value: Any, length: int = 16) -> str:
    """A short stable hash of any JSON-able value."""
    text = json.dumps(to_jsonable(value), sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:length]


def example_key(example: Any) -> str:
    """A stable key for an example: its fields' digest (the same across processes and resumes)."""
    return digest(example.toDict() if hasattr(example, "toDict") else example)
