"""Persisted state in ``log_dir``: what was paid for, and where the run stands.

* ``memo.jsonl``: the journal. One line per finished paid unit of work (a scored
  program run or a prompt-LM call), written as soon as it finishes. A resumed run
  replays the algorithm from the start and takes these results instead of paying
  again, so it reaches the same decisions as an uninterrupted run. Long texts
  (passages, instructions) are written once as a ``text`` line and referred to by
  digest afterwards. Each compile starts a ``segment`` line, and every record
  carries its time within the segment, so the time and money spent by every
  segment (killed ones too) can be read back.
* ``run.json``: the fingerprint of program, data, options, metric, LMs and
  prompts; resuming with anything else is refused (:func:`check_fingerprint`).
* ``state.json`` and ``result.json``: a readable snapshot, written atomically.

Crash guarantee: a record is handed to the OS with one ``write`` as soon as its
work is settled, so a SIGKILL loses only the work in flight. ``fsync`` (which
only matters if the machine itself goes down) is done once per settled batch and
at most once per ``SYNC_INTERVAL_S``, not once per line.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .usage import empty_usage

logger = logging.getLogger("dspy_agentgrad")

JOURNAL = "memo.jsonl"
TEXT_MIN_CHARS = 80
SYNC_INTERVAL_S = 1.0
PROMPT_KEY_PREFIX = "role:"  # journal keys of prompt-LM calls; every other record is a metric call


def atomic_write_json(path: Path, data: Any, indent: int | None = 2) -> None:
    """Write JSON so a reader (or a crash) never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=indent, ensure_ascii=False, default=str)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


class RunMismatch(ValueError):
    """``log_dir`` holds a run of another program, other data, options, metric, LMs or prompts."""


def _describe(previous: Any, current: Any) -> str:
    text = f"{json.dumps(previous, sort_keys=True, default=str)} -> {json.dumps(current, sort_keys=True, default=str)}"
    return text if len(text) <= 300 else text[:300] + " ..."


def check_fingerprint(log_dir: Path, fingerprint: dict, resume_despite: tuple[str, ...] = ()) -> bool:
    """Write the fingerprint on a new run; on resume, refuse a different one.

    Parts named in ``resume_despite`` may differ: the run resumes with a warning, the new values are
    recorded, and results already paid for under the old ones are replayed as they are.
    Returns True when a previous run exists (a resume).
    """
    path = Path(log_dir) / "run.json"
    if not path.exists():
        atomic_write_json(path, fingerprint)
        return False
    try:
        previous = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(previous, dict):
            raise ValueError("not a JSON object")
    except (ValueError, UnicodeDecodeError) as exc:
        raise RunMismatch(
            f"{path} is not a readable run fingerprint ({exc}); it was damaged or written by something else. "
            f"Use a new log_dir, or delete {path} to resume the journal in {log_dir} as a new run"
        ) from None
    diffs = sorted(k for k in set(previous) | set(fingerprint) if previous.get(k) != fingerprint.get(k))
    refused = [k for k in diffs if k not in resume_despite]
    if refused:
        details = "; ".join(f"{k}: {_describe(previous.get(k), fingerprint.get(k))}" for k in refused)
        overridable = [k for k in refused if k in ("metric", "task_lm", "prompt_lm", "prompts")]
        advice = (
            f", or pass resume_despite={tuple(overridable)!r} to continue knowingly (results paid under the old "
            "ones are replayed as they are)"
            if overridable and len(overridable) == len(refused)
            else ""
        )
        raise RunMismatch(
            f"log_dir {log_dir} holds a run with a different {', '.join(refused)} ({details}); use a new log_dir "
            f"to start a new run, or pass the same program, data, options, metric and LMs to resume{advice}"
        )
    if diffs:
        logger.warning("resuming %s despite a different %s (resume_despite)", log_dir, ", ".join(diffs))
        atomic_write_json(path, fingerprint)
    return True


# ---- the journal ------------------------------------------------------------------------------


@dataclass
class Segment:
    """One compile on a ``log_dir``: when it started, how long it ran, what it paid for."""

    index: int
    started: float
    wall_time_s: float = 0.0
    metric_calls: int = 0
    task: dict[str, int] = field(default_factory=empty_usage)
    prompt: dict[str, int] = field(default_factory=empty_usage)
    finished: bool = False

    def add(self, key: str, value: Any, at: float) -> None:
        """Count one finished piece of paid work in this compile's segment."""
        usage = value.get("usage") if isinstance(value, dict) else None
        bucket = self.prompt if key.startswith(PROMPT_KEY_PREFIX) else self.task
        if not key.startswith(PROMPT_KEY_PREFIX) and not (isinstance(value, dict) and value.get("scored") is False):
            self.metric_calls += 1  # a run that took its reference's score made no metric call
        for name in bucket:
            number = (usage or {}).get(name, 0)
            bucket[name] += int(number) if isinstance(number, (int, float)) else 0
        self.wall_time_s = max(self.wall_time_s, at)

    def to_dict(self) -> dict:
        """A JSON-ready form, for ``result.json``'s segments."""
        return asdict(self)


def _text_id(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def _is_reserved(value: dict) -> bool:
    return len(value) == 1 and next(iter(value)) in ("$t", "$d")


def _encode(value: Any, texts: dict[str, str]) -> Any:
    """Long strings become ``{"$t": id}`` (their text lands in ``texts``); user dicts shaped like that are escaped."""
    if isinstance(value, str):
        if len(value) < TEXT_MIN_CHARS:
            return value
        tid = _text_id(value)
        texts[tid] = value
        return {"$t": tid}
    if isinstance(value, dict):
        encoded = {k: _encode(v, texts) for k, v in value.items()}
        return {"$d": encoded} if _is_reserved(value) else encoded
    if isinstance(value, list):
        return [_encode(v, texts) for v in value]
    return value


def _decode(value: Any, texts: dict[str, str]) -> Any:
    if isinstance(value, dict):
        if _is_reserved(value):
            if "$t" in value:
                return texts[value["$t"]]
            return {k: _decode(v, texts) for k, v in value["$d"].items()}
        return {k: _decode(v, texts) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode(v, texts) for v in value]
    return value


class Memo:
    """Results paid for by an earlier compile on ``log_dir`` (read back), and the journal of new ones; thread-safe.

    The results of this compile are kept by :class:`PaidWork`, not here, so no
    result is held twice in memory. ``loaded`` counts records
    read back, ``dropped`` the lines that could not be (reported in the log; intact
    records after a damaged line are kept). ``segments`` lists earlier compiles on
    this ``log_dir`` and, last, this one.
    """

    def __init__(self, log_dir: Path | None = None):
        self._lock = threading.Lock()
        self._data: dict[str, Any] = {}
        self._texts: dict[str, str] = {}
        self.path = Path(log_dir) / JOURNAL if log_dir else None
        self.loaded = 0
        self.dropped = 0
        self.segments: list[Segment] = []
        self._fd: int | None = None
        self._dirty = False
        self._last_sync = 0.0
        if self.path and self.path.exists():
            self._load()
        self.segment = Segment(len(self.segments), time.time())
        self.segments.append(self.segment)
        self._clock = time.monotonic()
        if self.path:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            self._write([{"segment": {"index": self.segment.index, "started": self.segment.started}}])

    def _load(self) -> None:
        raw = self.path.read_bytes()
        lines = raw.split(b"\n")
        torn = lines.pop() if lines else b""  # the bytes after the last newline: a line cut short by a kill
        damaged: list[int] = []
        records: list[tuple[int, str, Any, float]] = []
        segment: Segment | None = None
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
                if "text" in entry:
                    self._texts[entry["text"]] = entry["value"]
                elif "segment" in entry:
                    segment = Segment(len(self.segments), float(entry["segment"]["started"]))
                    self.segments.append(segment)
                elif "segment_end" in entry:
                    if segment is not None:
                        segment.wall_time_s = float(entry["segment_end"]["wall_time_s"])
                        segment.finished = True
                else:
                    records.append((number, entry["key"], entry["value"], float(entry.get("at", 0.0))))
                    if segment is not None:
                        segment.add(entry["key"], entry["value"], float(entry.get("at", 0.0)))
            except (ValueError, KeyError, TypeError, AttributeError):
                damaged.append(number)
        for number, key, value, _ in records:
            try:
                _decode(value, self._texts)  # a record whose text line was damaged cannot be replayed
            except KeyError:
                damaged.append(number)
                continue
            self._data[key] = value
        if torn.strip():
            with open(self.path, "r+b") as handle:
                handle.truncate(len(raw) - len(torn))
            logger.warning("%s: dropped its last line, cut short by a kill (%d bytes)", self.path, len(torn))
        elif torn:
            with open(self.path, "r+b") as handle:
                handle.truncate(len(raw) - len(torn))
        self.dropped = len(damaged) + bool(torn.strip())
        if damaged:
            shown = ", ".join(map(str, sorted(damaged)[:10])) + (" ..." if len(damaged) > 10 else "")
            logger.warning(
                "%s: skipped %d damaged line(s) (line %s); the %d intact records are kept, "
                "and the work of the damaged ones is paid again",
                self.path,
                len(damaged),
                shown,
                len(self._data),
            )
        self.loaded = len(self._data)

    def _write(self, entries: list[dict], ready: str = "") -> None:
        """Append ``entries`` and the already serialized lines ``ready`` with one ``write``."""
        lines = "".join(json.dumps(e, ensure_ascii=False, default=str) + "\n" for e in entries) + ready
        view = memoryview(lines.encode("utf-8", "surrogatepass"))
        while view:
            view = view[os.write(self._fd, view) :]
        self._dirty = True

    def get(self, key: str) -> Any | None:
        """The record read back for ``key``, handed out once: the caller keeps it (no second copy here)."""
        # no lock: the records are all read before the run starts, and a dict pop is atomic; taking
        # the lock here made every settlement wait behind journal writes
        stored = self._data.pop(key, None) if self._data else None
        return None if stored is None else _decode(stored, self._texts)  # texts are only ever added

    def put(self, key: str, value: Any) -> None:
        """Keep a paid result: in memory, in the segment's accounting, and as a journal line."""
        at = round(time.monotonic() - self._clock, 3)
        if self._fd is None:  # no journal (no log_dir): the segment's accounting only, nothing to encode
            with self._lock:
                self.segment.add(key, value, at)
            return
        texts: dict[str, str] = {}
        encoded = _encode(value, texts)
        line = json.dumps({"key": key, "value": encoded, "at": at}, ensure_ascii=False, default=str) + "\n"
        with self._lock:
            self.segment.add(key, value, at)
            new_texts = [{"text": tid, "value": text} for tid, text in texts.items() if tid not in self._texts]
            self._texts.update(texts)
            if self._fd is not None:
                self._write(new_texts, line)  # a text line always lands before the first record using it

    def sync(self, force: bool = False) -> None:
        """fsync what was written, at most once per ``SYNC_INTERVAL_S`` unless ``force``."""
        with self._lock:
            if self._fd is None or not self._dirty:
                return
            now = time.monotonic()
            if not force and now - self._last_sync < SYNC_INTERVAL_S:
                return
            os.fsync(self._fd)
            self._dirty, self._last_sync = False, now

    def close(self) -> None:
        """Mark this segment finished (with its wall time) and release the file."""
        with self._lock:
            self.segment.wall_time_s = time.monotonic() - self._clock
            self.segment.finished = True
            if self._fd is None:
                return
            self._write([{"segment_end": {"index": self.segment.index, "wall_time_s": self.segment.wall_time_s}}])
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = None

    def segment_report(self) -> list[dict]:
        """Every segment on this ``log_dir`` (earlier compiles, then this one) as dicts, times up to now."""
        with self._lock:
            if not self.segment.finished:
                self.segment.wall_time_s = time.monotonic() - self._clock
            return [seg.to_dict() for seg in self.segments]
