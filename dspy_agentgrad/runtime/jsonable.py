"""Turning DSPy values into JSON and stable hashes (for caches, state files and keys)."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def to_jsonable(value: Any) -> Any:
    """``value`` as plain JSON types, so results, events and journal lines always serialize."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [to_jsonable(v) for v in value]
    if hasattr(value, "model_dump"):
        return to_jsonable(value.model_dump())
    if hasattr(value, "toDict"):
        return to_jsonable(value.toDict())
    return str(value)


def digest(value: Any, length: int = 16) -> str:
    """A short stable hash of any JSON-able value."""
    text = json.dumps(to_jsonable(value), sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:length]


def example_key(example: Any) -> str:
    """A stable key for an example: its fields' digest (the same across processes and resumes)."""
    return digest(example.toDict() if hasattr(example, "toDict") else example)
