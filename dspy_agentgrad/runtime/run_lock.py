"""One compile at a time on a ``log_dir``.

Two compiles on one folder would both pay in full and overwrite each other's state. The lock is
an OS lock that the kernel releases when its holder dies, so a killed holder never blocks a
resume. Where the OS allows (POSIX), it is taken on the ``log_dir`` folder itself, so deleting a
file cannot defeat it (a lock on a lock file is lost when the file is deleted: the next compile
creates a new file and locks that). On Windows, ``filelock`` locks ``log_dir/lock``, which cannot
be deleted while it is held open. The file ``log_dir/lock`` also names the holder (pid, host,
start time) for the message; when it cannot be written (a full disk), the lock is released again.

A process the program forks (``os.fork``, ``multiprocessing``) would inherit the open folder and
with it the lock, and keep a killed compile's ``log_dir`` locked for as long as it lives: the child
closes its copy as soon as it is forked, so the lock lives exactly as long as the compile.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from pathlib import Path

import filelock

from .atomic_files import atomic_write_text

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

LOCK_FILE = "lock"
_HELD: set[int] = set()  # folder descriptors holding a lock in this process: closed in a forked child


def _close_in_child() -> None:
    for fd in list(_HELD):
        with contextlib.suppress(OSError):
            os.close(fd)
    _HELD.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_in_child)


class LogDirBusy(RuntimeError):
    """Another live process is compiling on this ``log_dir``."""


class LogDirLock:
    """Context manager holding the lock on ``log_dir`` for the length of a compile."""

    def __init__(self, log_dir: Path):
        self.folder = Path(log_dir)
        self.path = self.folder / LOCK_FILE
        self._release = None

    def __enter__(self) -> LogDirLock:
        self.folder.mkdir(parents=True, exist_ok=True)
        try:
            self._release = _lock_folder(self.folder) if fcntl is not None else _lock_file(self.path)
        except (OSError, filelock.Timeout):
            raise LogDirBusy(
                f"log_dir {self.folder} is in use by another compile ({_describe(self.path)}); wait for it to "
                "finish or stop it, or use another log_dir. A killed holder releases the lock by itself"
            ) from None
        holder = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}
        try:
            atomic_write_text(self.path, json.dumps(holder))  # replaces a link planted there, never writes through
        except BaseException:
            self._unlock()
            raise
        return self

    def __exit__(self, *exc) -> None:
        if self._release is not None:
            with contextlib.suppress(OSError):
                self.path.unlink()  # no holder now (a link there is removed, not followed)
            self._unlock()

    def _unlock(self) -> None:
        release, self._release = self._release, None
        if release is not None:
            release()


def _lock_folder(folder: Path):
    """flock on the folder itself; returns the release function."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise
    _HELD.add(fd)

    def release() -> None:
        _HELD.discard(fd)
        os.close(fd)  # closing releases the flock

    return release


def _lock_file(path: Path):
    lock = filelock.FileLock(str(path) + ".filelock", timeout=0)
    lock.acquire()
    return lock.release


def _describe(path: Path) -> str:
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
        return f"pid {info['pid']} on host {info['host']}, started {info['started']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "holder unknown"
