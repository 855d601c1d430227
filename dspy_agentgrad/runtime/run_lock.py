"""One compile at a time on a ``log_dir``.

Two compiles on one folder would both pay in full and overwrite each other's
state. The lock is an OS advisory lock (``flock``) on ``log_dir/lock``, which
the kernel releases when its holder dies, so a killed holder never blocks a
resume; the file also names the holder (pid, host, start time) for the message.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows: no advisory locks here; runs are not protected against a second compile
    fcntl = None

LOCK_FILE = "lock"


class LogDirBusy(RuntimeError):
    """Another live process is compiling on this ``log_dir``."""


class LogDirLock:
    """Context manager holding the lock on ``log_dir`` for the length of a compile."""

    def __init__(self, log_dir: Path):
        self.path = Path(log_dir) / LOCK_FILE
        self._fd: int | None = None

    def __enter__(self) -> LogDirLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                holder = os.read(fd, 4096).decode("utf-8", "replace")
                os.close(fd)
                raise LogDirBusy(
                    f"log_dir {self.path.parent} is in use by another compile ({_describe(holder)}); wait for it to "
                    "finish or stop it, or use another log_dir. A killed holder releases the lock by itself"
                ) from None
        holder = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(holder).encode(), 0)
        self._fd = fd
        return self

    def __exit__(self, *exc) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            os.close(self._fd)  # closing releases the flock
            self._fd = None


def _describe(holder: str) -> str:
    try:
        info = json.loads(holder)
        return f"pid {info['pid']} on host {info['host']}, started {info['started']}"
    except (ValueError, KeyError, TypeError):
        return "holder unknown"
