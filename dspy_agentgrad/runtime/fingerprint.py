"""``run.json``: the fingerprint of program, data, options, metric, LMs and prompts that a resumed run must
share, and the run id its journal records carry."""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .atomic_files import atomic_write_json
from .store import JOURNAL

logger = logging.getLogger("dspy.agentgrad")


class RunMismatch(ValueError):
    """``log_dir`` holds a run of another program, other data, options, metric, LMs, adapter or prompts."""


#: Fingerprint parts a user may knowingly change on resume (``AgentGrad(resume_despite=...)``).
OVERRIDABLE = ("metric", "task_lm", "prompt_lm", "prompts", "adapter", "options")
#: Options that only say where a run stops. A resume may change them (extend a run that stopped at its
#: budget or round limit, or stop it sooner): the journal's results stay valid, since each is keyed by
#: what determines it, and the replay reaches the same decisions up to the old stopping point.
STOPPING_OPTIONS = ("auto", "max_metric_calls", "max_full_evals", "max_rounds", "max_prompt_tokens", "max_prompt_cost")
#: Parts an older version did not record: a fingerprint without them resumes, and they are recorded.
ADDED_PARTS = ("adapter", "task_lm.endpoint", "prompt_lm.endpoint")
RUN_ID = "run_id"
_ABSENT = object()


@dataclass(frozen=True)
class RunIdentity:
    """Whether ``log_dir`` already held this run, and the id its journal records carry."""

    resumed: bool
    run_id: str


def _added_at_default(where: str, value: Any, defaults: dict) -> bool:
    """An option the earlier run could not record (it did not exist then) at its neutral default: no difference."""
    part, _, option = where.partition(".")
    return part == "options" and option in defaults and value == defaults[option]


def _differences(
    previous: Any, current: Any, path: str = "", defaults: dict | None = None
) -> list[tuple[str, Any, Any]]:
    """(dotted path, old, new) for every leaf that differs; dicts are compared key by key. ``defaults``: the
    neutral value of each option, for options absent from ``previous``."""
    if isinstance(previous, dict) and isinstance(current, dict):
        found = []
        for key in sorted(set(previous) | set(current)):
            where = f"{path}.{key}" if path else key
            if key == RUN_ID or (key not in previous and where in ADDED_PARTS):
                continue
            if key not in previous and _added_at_default(where, current[key], defaults or {}):
                continue
            found += _differences(previous.get(key, _ABSENT), current.get(key, _ABSENT), where, defaults)
        return found
    return [] if previous == current else [(path, previous, current)]


def _shown(value: Any) -> str:
    text = "(not set)" if value is _ABSENT else json.dumps(value, sort_keys=True, default=str, ensure_ascii=False)
    return text if len(text) <= 80 else text[:77] + "..."


def _is_stopping(path: str) -> bool:
    part, _, option = path.partition(".")
    return part == "options" and option in STOPPING_OPTIONS


def check_fingerprint(
    log_dir: Path, fingerprint: dict, resume_despite: tuple[str, ...] = (), option_defaults: dict | None = None
) -> RunIdentity:
    """Write the fingerprint on a new run; on resume, refuse a different one.

    The stopping options (:data:`STOPPING_OPTIONS`) may differ: the run goes on to the new limits.
    Parts named in ``resume_despite`` may differ too: the run resumes with a warning, the new values
    are recorded, and results already paid for under the old ones are replayed as they are. An option
    the earlier run did not record, now at its neutral value in ``option_defaults``, is no difference.
    A journal without its ``run.json`` is refused: nothing could tell whether its results belong to this run.
    """
    path = Path(log_dir) / "run.json"
    journal = Path(log_dir) / JOURNAL
    if not path.exists() and (journal.is_symlink() or (journal.exists() and journal.stat().st_size > 0)):
        raise RunMismatch(
            f"{path} is missing, but {journal} holds the journal of an earlier run: without run.json nothing tells "
            f"which program, data and options its results were paid for. Restore {path} (e.g. from a backup of "
            f"{log_dir}), or use a new log_dir; to start over here, delete {journal} (its results are paid again)"
        )
    if not path.exists():
        run_id = uuid.uuid4().hex[:12]
        atomic_write_json(path, {**fingerprint, RUN_ID: run_id})
        return RunIdentity(False, run_id)
    try:
        previous = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(previous, dict):
            raise ValueError("not a JSON object")
    except (ValueError, UnicodeDecodeError) as exc:
        raise RunMismatch(
            f"{path} is not a readable run fingerprint ({exc}); it was damaged or written by something else. "
            f"Use a new log_dir, or delete {path} to resume the journal in {log_dir} as a new run"
        ) from None
    diffs = _differences(previous, fingerprint, defaults=option_defaults)
    refused = [d for d in diffs if not _is_stopping(d[0]) and d[0].split(".")[0] not in resume_despite]
    if refused:
        details = "; ".join(f"{where}: {_shown(old)} -> {_shown(new)}" for where, old, new in refused)
        parts = sorted({where.split(".")[0] for where, _, _ in refused})
        advice = (
            f"pass resume_despite={tuple(parts)!r} to continue knowingly (results paid under the old values are "
            "replayed as they are), or use a new log_dir to start a new run"
            if set(parts) <= set(OVERRIDABLE)
            else "use a new log_dir to start a new run, or pass the same program and data to resume"
        )
        raise RunMismatch(f"log_dir {log_dir} holds a run with a different {', '.join(parts)} ({details}); {advice}")
    for where, old, new in diffs:
        log = logger.info if _is_stopping(where) else logger.warning
        log("resuming %s with %s: %s -> %s", log_dir, where, _shown(old), _shown(new))
    run_id = previous.get(RUN_ID) or uuid.uuid4().hex[:12]  # a run.json from before run ids gets one now
    updated = {**fingerprint, RUN_ID: run_id}
    if updated != previous:
        atomic_write_json(path, updated)
    return RunIdentity(True, run_id)
