"""Accounting across resumes for the head-to-head runner.

An optimizer run that was killed and is started again resumes from its ``log_dir``
(AgentGrad's journal, GEPA's run directory), so the counters of the new process
see only its own segment. :class:`SegmentLog` keeps one entry per segment in
``log_dir/harness_segments.json`` (metric calls, LM calls and tokens by role,
wall time), saved every ``SAVE_INTERVAL_S`` while the run goes on, so a killed
segment is still counted (up to its last second). ``results.json`` reports the
totals over every segment, and ``within_budget`` is judged on them.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

from dspy_agentgrad.runtime.atomic_files import atomic_write_json

logger = logging.getLogger(__name__)

SEGMENTS_FILE = "harness_segments.json"
SAVE_INTERVAL_S = 1.0


class SegmentLog:
    """Segments of one optimizer run on one ``log_dir``; use as a context manager around the run."""

    def __init__(self, log_dir: str | Path | None, meter: Any, counter: Any):
        self.path = None if log_dir is None else Path(log_dir) / SEGMENTS_FILE
        self.meter, self.counter = meter, counter
        self.previous: list[dict] = self._load()
        self.current: dict = {"started": time.time(), "finished": False}
        self._start = time.perf_counter()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._saver: threading.Thread | None = None

    def _load(self) -> list[dict]:
        if self.path is None or not self.path.exists():
            return []
        try:
            segments = json.loads(self.path.read_text(encoding="utf-8"))
            return segments if isinstance(segments, list) else []
        except ValueError:
            logger.warning("%s is unreadable: earlier segments of this run are not counted", self.path)
            return []

    def _refresh(self, metric_calls: int | None = None) -> None:
        self.current.update(
            wall_time_s=time.perf_counter() - self._start,
            metric_calls=self.counter.calls if metric_calls is None else metric_calls,
            feedback_only_metric_calls=self.counter.feedback_calls,
            usage=self.meter.snapshot(),
        )

    def save(self, metric_calls: int | None = None) -> None:
        with self._lock:
            self._refresh(metric_calls)
            if self.path is not None:
                atomic_write_json(self.path, self.segments, indent=None)

    @property
    def segments(self) -> list[dict]:
        return [*self.previous, self.current]

    def _keep_saving(self) -> None:
        while not self._stop.wait(SAVE_INTERVAL_S):
            self.save()

    def __enter__(self) -> SegmentLog:
        self.save()
        if self.path is not None:
            self._saver = threading.Thread(target=self._keep_saving, name="segment-log", daemon=True)
            self._saver.start()
        return self

    def finish(self, metric_calls: int) -> None:
        """The segment ended normally, having made ``metric_calls`` metric calls."""
        self.current["finished"] = True
        self.save(metric_calls)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._saver is not None:
            self._saver.join()
        if not self.current["finished"]:
            self.save()

    def totals(self) -> dict:
        """Metric calls, wall time and LM usage by role, summed over every segment."""
        usage: dict[str, dict[str, int]] = {}
        for seg in self.segments:
            for role, counts in (seg.get("usage") or {}).items():
                bucket = usage.setdefault(role, {})
                for key, value in counts.items():
                    bucket[key] = bucket.get(key, 0) + value
        return {
            "metric_calls": sum(seg.get("metric_calls", 0) for seg in self.segments),
            "wall_time_s": sum(seg.get("wall_time_s", 0.0) for seg in self.segments),
            "usage": usage,
        }
