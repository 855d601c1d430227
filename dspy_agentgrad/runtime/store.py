"""Persisted state in ``log_dir``: what was paid for, and where the run stands.

* ``memo.jsonl``: the journal. One line per finished paid unit of work (a scored
  program run, a prompt-LM call, and every task-LM answer as soon as it arrives),
  written as soon as it finishes. Each line carries the run id and ends with a
  checksum of itself: a line of another run or one edited afterwards is reported
  and not trusted. A resumed run
  replays the algorithm from the start and takes these results instead of paying
  again, so it reaches the same decisions as an uninterrupted run. Long texts
  (passages, instructions) are written once as a ``text`` line and referred to by
  digest afterwards. Each compile starts a ``segment`` line, and every record
  carries its time within the segment, so the time and money spent by every
  segment (killed ones too) can be read back.
* ``run.json``: the fingerprint of program, data, options, metric, LMs and
  prompts, and the run id every journal line carries; resuming with anything else is refused
  (:func:`.fingerprint.check_fingerprint`). A ``log_dir`` written by an earlier version is upgraded to
  this format when a resume opens it (:mod:`.migration`).
* ``state.json`` and ``result.json``: a readable snapshot. Every file in ``log_dir`` is written
  atomically (:func:`.atomic_files.atomic_write_bytes`); the journal is appended to, never through a link.

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
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .usage import empty_usage

logger = logging.getLogger("dspy.agentgrad")

JOURNAL = "memo.jsonl"
RUN_FILE = "run.json"
RUN_ID = "run_id"  # the field of run.json holding the run id
RUN_TAG = "run"  # the field of a journal line holding it
TEXT_MIN_CHARS = 80
SYNC_INTERVAL_S = 1.0
PROMPT_KEY_PREFIX = "role:"  # journal keys of prompt-LM calls
ANSWER_KEY_PREFIX = "answer:"  # journal keys of task-LM answers (counted with the run they belong to)


def new_run_id() -> str:
    """The id of a new run, written to ``run.json`` and carried by every journal line."""
    return uuid.uuid4().hex[:12]


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
        """Count one finished piece of paid work in this compile's segment. A task-LM answer is counted with the
        run it belongs to (its usage is in that run's record), not on its own."""
        self.wall_time_s = max(self.wall_time_s, at)
        if key.startswith(ANSWER_KEY_PREFIX):
            return
        usage = value.get("usage") if isinstance(value, dict) else None
        bucket = self.prompt if key.startswith(PROMPT_KEY_PREFIX) else self.task
        if not key.startswith(PROMPT_KEY_PREFIX) and not (isinstance(value, dict) and value.get("scored") is False):
            self.metric_calls += 1  # a run that took its reference's score made no metric call
        for name in bucket:
            number = (usage or {}).get(name, 0)
            bucket[name] += int(number) if isinstance(number, (int, float)) else 0

    def to_dict(self) -> dict:
        """A JSON-ready form, for ``result.json``'s segments."""
        return asdict(self)


#: Each journal line ends with ``"sum": <checksum of the line before it>``: a record edited by hand, or cut
#: and pasted with another run id, no longer matches and is not trusted.
SUM_FIELD = "sum"


def _checksum(body: str) -> str:
    return hashlib.sha256(body.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def sealed(entry: dict) -> str:
    """A journal line for ``entry`` (a non-empty dict), its checksum last."""
    body = json.dumps(entry, ensure_ascii=False, default=str)
    return f'{body[:-1]}, "{SUM_FIELD}": "{_checksum(body)}"}}\n'


def _seal_holds(line: str, entry: dict) -> bool:
    """Whether ``line`` (read back, without its newline) is the sealed form of what it says."""
    tail = f', "{SUM_FIELD}": "{entry[SUM_FIELD]}"}}'
    return line.endswith(tail) and _checksum(line[: -len(tail)] + "}") == entry[SUM_FIELD]


class LinkInLogDir(RuntimeError):
    """A file AgentGrad appends to in ``log_dir`` is a symbolic link: it is never written through."""


def open_journal(path: Path) -> int:
    """The journal opened for appending; a symbolic link there (planted by a copied or restored ``log_dir``)
    is refused, never followed."""
    try:
        return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
    except OSError as exc:
        if not path.is_symlink():
            raise
        raise LinkInLogDir(
            f"{path} is a symbolic link (to {os.readlink(path)}): AgentGrad appends to its journal only in "
            "log_dir itself, never through a link. Replace the link with the file it points to (or remove it to "
            "start over), or use another log_dir"
        ) from exc


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

    def __init__(self, log_dir: Path | None = None, run_id: str | None = None):
        self._lock = threading.Lock()
        self.run_id = run_id
        self.foreign = 0  # records of another run found in the journal (appended from elsewhere): not used
        self.untrusted = 0  # lines whose checksum fails (edited after they were written): not used
        self._data: dict[str, Any] = {}
        self._texts: dict[str, str] = {}
        self.path = Path(log_dir) / JOURNAL if log_dir else None
        self.loaded = 0
        self.dropped = 0
        self.segments: list[Segment] = []
        self._fd: int | None = None
        self._dirty = False
        self._last_sync = 0.0
        if self.path and self.path.is_symlink():
            open_journal(self.path)  # raises: a link is neither read nor written through
        if self.path and self.path.exists():
            self._load()
        self.segment = Segment(len(self.segments), time.time())
        self.segments.append(self.segment)
        self._clock = time.monotonic()
        if self.path:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = open_journal(self.path)
            self._write([{"segment": {"index": self.segment.index, "started": self.segment.started}, **self._tag}])

    @property
    def _tag(self) -> dict[str, str]:
        """What ties a journal line to this run (nothing without a run id)."""
        return {} if self.run_id is None else {RUN_TAG: self.run_id}

    def _foreign(self, entry: dict) -> bool:
        """A line not written by this run (checked when the run has an id)."""
        return self.run_id is not None and entry.get(RUN_TAG) != self.run_id

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
                text = line.decode("utf-8", "surrogatepass")
                entry = json.loads(text)
                if SUM_FIELD not in entry or not _seal_holds(text, entry):
                    self.untrusted += 1
                    continue
                if "text" in entry:  # texts are named by their digest: any run's copy is the same text
                    self._texts[entry["text"]] = entry["value"]
                elif self._foreign(entry):
                    self.foreign += "key" in entry
                elif "segment" in entry:
                    segment = Segment(len(self.segments), float(entry["segment"]["started"]))
                    self.segments.append(segment)
                elif "segment_end" in entry:
                    if segment is not None:
                        segment.wall_time_s = float(entry["segment_end"]["wall_time_s"])
                        segment.finished = True
                else:
                    records.append((number, entry["key"], entry["value"], float(entry["at"])))
                    if segment is not None:
                        segment.add(entry["key"], entry["value"], float(entry["at"]))
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
        if self.untrusted:
            logger.warning(
                "%s: %d line(s) do not match their checksum (edited after they were written, or appended without "
                "one): not trusted, so their results are not used; what they held is paid again if the run needs it",
                self.path,
                self.untrusted,
            )
        if self.foreign:
            logger.warning(
                "%s: ignored %d record(s) of another run (another run id than run.json's: lines appended from "
                "another log_dir's journal?); this run's own results are used, the rest is paid again if needed",
                self.path,
                self.foreign,
            )
        self.loaded = len(self._data)

    def _write(self, entries: list[dict], ready: str = "") -> None:
        """Append ``entries`` and the already serialized lines ``ready`` with one ``write``."""
        lines = "".join(sealed(e) for e in entries) + ready
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

    def has(self, key: str) -> bool:
        """Whether a record for ``key`` was read back and not handed out yet."""
        return bool(self._data) and key in self._data

    def put(self, key: str, value: Any) -> None:
        """Keep a paid result: in memory, in the segment's accounting, and as a journal line."""
        at = round(time.monotonic() - self._clock, 3)
        if self._fd is None:  # no journal (no log_dir): the segment's accounting only, nothing to encode
            with self._lock:
                self.segment.add(key, value, at)
            return
        texts: dict[str, str] = {}
        encoded = _encode(value, texts)
        entry = {"key": key, "value": encoded, "at": at, **self._tag}
        line = sealed(entry)
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
            end = {"index": self.segment.index, "wall_time_s": self.segment.wall_time_s}
            self._write([{"segment_end": end, **self._tag}])
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = None

    def segment_report(self) -> list[dict]:
        """Every segment on this ``log_dir`` (earlier compiles, then this one) as dicts, times up to now."""
        with self._lock:
            if not self.segment.finished:
                self.segment.wall_time_s = time.monotonic() - self._clock
            return [seg.to_dict() for seg in self.segments]
