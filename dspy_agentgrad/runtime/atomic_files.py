"""Files in ``log_dir`` written atomically: a reader (or a crash) sees the old file or the new one, never
half of one."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` so a reader, a crash or a full disk never leaves half a file: a temporary file in the same
    folder, synced, then renamed over ``path``. A failed write removes its temporary file and leaves the old
    ``path`` as it was; a symbolic link at ``path`` is replaced, never written through."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    """:func:`atomic_write_bytes` of ``text`` as UTF-8."""
    atomic_write_bytes(path, text.encode("utf-8", "surrogatepass"))


def atomic_write_json(path: Path, data: Any, indent: int | None = 2) -> None:
    """:func:`atomic_write_text` of ``data`` as JSON."""
    atomic_write_text(path, json.dumps(data, indent=indent, ensure_ascii=False, default=str))
