"""``run.json``: the fingerprint of program, data, options, metric, LMs and prompts that a resumed run must
share, and the run id its journal records carry. A ``log_dir`` of an earlier version is read through
:mod:`.migration`, so what is compared here is always the current format."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .atomic_files import atomic_write_json
from .migration import migrate, upgraded_run
from .store import JOURNAL, RUN_FILE, RUN_ID, new_run_id

logger = logging.getLogger("dspy.agentgrad")


class RunMismatch(ValueError):
    """``log_dir`` holds a run of another program, other data, options, metric, LMs, adapter or prompts."""


#: Fingerprint parts a user may knowingly change on resume (``AgentGrad(resume_despite=...)``).
OVERRIDABLE = ("metric", "task_lm", "prompt_lm", "prompts", "adapter", "options")
#: Options that only say where a run stops. A resume may change them (extend a run that stopped at its
#: budget or round limit, or stop it sooner): the journal's results stay valid, since each is keyed by
#: what determines it, and the replay reaches the same decisions up to the old stopping point.
STOPPING_OPTIONS = ("auto", "max_metric_calls", "max_full_evals", "max_rounds", "max_prompt_tokens", "max_prompt_cost")
#: Options that change what is done ahead, never a decision (docs/guarantees.md): a resume may change them too, and
#: a run recorded under an earlier default resumes under the current one.
AHEAD_OPTIONS = ("speculate",)
_ABSENT = object()


@dataclass(frozen=True)
class RunIdentity:
    """Whether ``log_dir`` already held this run, and the id its journal records carry."""

    resumed: bool
    run_id: str


def _differences(previous: Any, current: Any, path: str = "") -> list[tuple[str, Any, Any]]:
    """(dotted path, old, new) for every leaf that differs; dicts are compared key by key."""
    if isinstance(previous, dict) and isinstance(current, dict):
        found = []
        for key in sorted(set(previous) | set(current)):
            where = f"{path}.{key}" if path else key
            if key != RUN_ID:
                found += _differences(previous.get(key, _ABSENT), current.get(key, _ABSENT), where)
        return found
    return [] if previous == current else [(path, previous, current)]


def _shown(value: Any) -> str:
    text = "(not set)" if value is _ABSENT else json.dumps(value, sort_keys=True, default=str, ensure_ascii=False)
    return text if len(text) <= 80 else text[:77] + "..."


def _may_differ(path: str) -> bool:
    """Whether a resume may change the fingerprint at ``path`` without being told: a stopping option, or one that
    changes no decision."""
    part, _, option = path.partition(".")
    return part == "options" and option in STOPPING_OPTIONS + AHEAD_OPTIONS


def check_fingerprint(
    log_dir: Path, fingerprint: dict, resume_despite: tuple[str, ...] = (), option_defaults: dict | None = None
) -> RunIdentity:
    """Write the fingerprint on a new run; on resume, refuse a different one.

    The stopping options (:data:`STOPPING_OPTIONS`) may differ: the run goes on to the new limits; so may
    :data:`AHEAD_OPTIONS`, which change no decision.
    Parts named in ``resume_despite`` may differ too: the run resumes with a warning, the new values
    are recorded, and results already paid for under the old ones are replayed as they are. A ``log_dir``
    of an earlier version is compared in the current format (``option_defaults``: each option's neutral
    value, see :func:`.migration.upgraded_run`), and upgraded on disk when the resume is allowed.
    A journal without its ``run.json`` is refused: nothing could tell whether its results belong to this run.
    """
    path = Path(log_dir) / RUN_FILE
    journal = Path(log_dir) / JOURNAL
    if not path.exists() and (journal.is_symlink() or (journal.exists() and journal.stat().st_size > 0)):
        raise RunMismatch(
            f"{path} is missing, but {journal} holds the journal of an earlier run: without run.json nothing tells "
            f"which program, data and options its results were paid for. Restore {path} (e.g. from a backup of "
            f"{log_dir}), or use a new log_dir; to start over here, delete {journal} (its results are paid again)"
        )
    if not path.exists():
        run_id = new_run_id()
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
    upgraded = upgraded_run(previous, fingerprint, option_defaults or {})
    diffs = _differences(upgraded, fingerprint)
    refused = [d for d in diffs if not _may_differ(d[0]) and d[0].split(".")[0] not in resume_despite]
    if refused:
        details = "; ".join(f"{where}: {_shown(old)} -> {_shown(new)}" for where, old, new in refused)
        parts = sorted({where.split(".")[0] for where, _, _ in refused})
        recorded = [
            f"{where[len('options.') :]}={_shown(old)}"
            for where, old, _ in refused
            if where.startswith("options.") and old is not _ABSENT
        ]
        as_it_was = (
            f"pass the options it recorded ({', '.join(recorded)}) to resume it as it was, or "
            if recorded and parts == ["options"]
            else ""
        )
        advice = (
            f"{as_it_was}pass resume_despite={tuple(parts)!r} to continue knowingly (results paid under the old values "
            "are replayed as they are), or use a new log_dir to start a new run"
            if set(parts) <= set(OVERRIDABLE)
            else "use a new log_dir to start a new run, or pass the same program and data to resume"
        )
        raise RunMismatch(f"log_dir {log_dir} holds a run with a different {', '.join(parts)} ({details}); {advice}")
    for where, old, new in diffs:
        log = logger.info if _may_differ(where) else logger.warning
        log("resuming %s with %s: %s -> %s", log_dir, where, _shown(old), _shown(new))
    updated = {**fingerprint, RUN_ID: upgraded[RUN_ID]}
    if not migrate(Path(log_dir), previous, updated) and updated != previous:
        atomic_write_json(path, updated)
    return RunIdentity(True, updated[RUN_ID])
