"""Persisted state in ``log_dir``: what was paid for, and where the run stands.

* ``memo.jsonl``: one line per finished paid unit of work (a scored program run
  or a prompt-LM call), appended as soon as it finishes. A resumed run replays
  the algorithm from the start and takes these results instead of paying again,
  so it reaches the same decisions as an uninterrupted run.
* ``run.json``: the fingerprint of program, data and options; resuming with
  anything else is refused.
* ``state.json`` and ``result.json``: a readable snapshot, written atomically
  after every phase and every accepted or rejected update.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
from pathlib import Path
from typing import Any


def atomic_write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=2, ensure_ascii=False, default=str)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


class RunMismatch(ValueError):
    """``log_dir`` holds a run of another program, other data or other options."""


class Memo:
    """Results already paid for, keyed by what produced them; thread-safe.

    Without a ``log_dir`` it is an in-memory cache only.
    """

    def __init__(self, log_dir: Path | None = None):
        self._lock = threading.Lock()
        self._data: dict[str, Any] = {}
        self.path = Path(log_dir) / "memo.jsonl" if log_dir else None
        self.loaded = 0
        if self.path and self.path.exists():
            self._load()

    def _load(self) -> None:
        good = 0
        with open(self.path, "rb") as handle:
            raw = handle.read()
        for line in raw.split(b"\n"):
            if not line.strip():
                good += len(line) + 1
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                break  # a line cut short by a kill: everything after it is dropped
            self._data[record["key"]] = record["value"]
            good += len(line) + 1
        if good < len(raw):
            with open(self.path, "r+b") as handle:
                handle.truncate(min(good, len(raw)))
        self.loaded = len(self._data)

    def get(self, key: str) -> Any | None:
        with self._lock:
            return self._data.get(key)

    def put(self, key: str, value: Any) -> None:
        line = json.dumps({"key": key, "value": value}, ensure_ascii=False, default=str)
        with self._lock:
            self._data[key] = value
            if self.path:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                with open(self.path, "a", encoding="utf-8") as handle:
                    handle.write(line + "\n")
                    handle.flush()
                    os.fsync(handle.fileno())


def check_fingerprint(log_dir: Path, fingerprint: dict) -> bool:
    """Write the fingerprint on a new run; on resume, refuse a different one.

    Returns True when a previous run of the same fingerprint exists (a resume).
    """
    path = Path(log_dir) / "run.json"
    if path.exists():
        previous = json.loads(path.read_text(encoding="utf-8"))
        diffs = sorted(k for k in set(previous) | set(fingerprint) if previous.get(k) != fingerprint.get(k))
        if diffs:
            raise RunMismatch(
                f"log_dir {log_dir} holds a run with a different {', '.join(diffs)}; "
                "use a new log_dir to start a new run, or pass the same program, data and options to resume"
            )
        return True
    atomic_write_json(path, fingerprint)
    return False
