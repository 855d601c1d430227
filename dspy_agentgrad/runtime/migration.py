"""Upgrading a ``log_dir`` written by an earlier version, once, when a resume opens it.

Earlier versions wrote ``run.json`` without a run id, an adapter or LM endpoints, and with fewer options;
their journal lines carried no run id and no checksum. Rather than every reader accepting each of those
forms, a resume upgrades them here to the current format, and the rest of the package reads that one:

* ``run.json`` gets a run id, and the parts and options it could not record are taken as they are now
  (an option only at its neutral default, the value the earlier run behaved as): no difference either way.
* each journal line the earlier version trusted (those before its first checksummed line) is tagged with
  the run id and sealed; lines it did not trust (damaged, edited, appended) are copied as they are, so the
  journal reader sets them aside as before, and so a resume reaches the same decisions as before.

The originals are kept in ``log_dir/pre-migration/``; every file is written atomically, ``run.json`` before
the journal, so a migration cut short by a kill is finished by the next resume. A ``log_dir`` already in
the current format is left as it is.
"""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path

from .atomic_files import atomic_write_bytes, atomic_write_json
from .store import JOURNAL, RUN_FILE, RUN_ID, RUN_TAG, SUM_FIELD, new_run_id, sealed

logger = logging.getLogger("dspy.agentgrad")

#: Where the files of ``log_dir`` are kept as the earlier version wrote them.
PRE_MIGRATION = "pre-migration"
#: The LMs' parts of the fingerprint whose endpoint an earlier version did not record.
LM_PARTS = ("task_lm", "prompt_lm")


def upgraded_run(previous: dict, fingerprint: dict, option_defaults: dict) -> dict:
    """``previous`` (``run.json`` as read) in the current format, for comparing with ``fingerprint``.

    A part the earlier version did not record (the adapter, an LM's endpoint) is taken from ``fingerprint``:
    the earlier run resumes whatever it is now. An option it did not record is taken too when it is at its
    neutral value in ``option_defaults``; any other value stays a difference.
    """
    run = copy.deepcopy(previous)
    run.setdefault(RUN_ID, new_run_id())
    if "adapter" in fingerprint:
        run.setdefault("adapter", fingerprint["adapter"])
    for part in LM_PARTS:
        if isinstance(run.get(part), dict) and isinstance(fingerprint.get(part), dict):
            run[part].setdefault("endpoint", fingerprint[part].get("endpoint"))
    options, current = run.get("options"), fingerprint.get("options")
    if isinstance(options, dict) and isinstance(current, dict):
        for option, value in current.items():
            if option not in options and option in option_defaults and value == option_defaults[option]:
                options[option] = value
    return run


def _entry(line: bytes) -> dict | None:
    """A journal line read as a non-empty JSON object, or ``None`` (damaged, or not a record)."""
    try:
        entry = json.loads(line)
    except ValueError:
        return None
    return entry if isinstance(entry, dict) and entry else None


def journal_is_current(path: Path) -> bool:
    """Whether the journal is in the current format: its first readable line is sealed (every version that
    sealed its lines also tagged them with the run id). No journal, or a link, is nothing to upgrade."""
    if path.is_symlink() or not path.exists():
        return True
    with open(path, "rb") as handle:
        for line in handle:
            entry = _entry(line) if line.endswith(b"\n") else None
            if entry is not None:
                return SUM_FIELD in entry
    return True


def upgraded_journal(raw: bytes, run_id: str) -> bytes:
    """The journal ``raw`` in the current format: each line before the first sealed one that is a record
    gets the run id (text lines carry none), its time within the segment, and a seal; every other line,
    and a last line a kill cut short, is kept byte for byte."""
    lines = raw.split(b"\n")
    torn = lines.pop()
    out, sealed_seen = [], False
    for line in lines:
        entry = _entry(line)
        sealed_seen = sealed_seen or (entry is not None and SUM_FIELD in entry)
        if sealed_seen or entry is None:
            out.append(line + b"\n")
            continue
        if "text" not in entry:
            entry.setdefault(RUN_TAG, run_id)
            if "key" in entry:
                entry.setdefault("at", 0.0)
        out.append(sealed(entry).encode("utf-8", "surrogatepass"))
    return b"".join(out) + torn


def migrate(log_dir: Path, previous: dict, current: dict) -> bool:
    """Write ``current`` as ``run.json`` and the journal in the current format, the originals kept in
    ``pre-migration/``, if ``previous`` (``run.json`` as read) or the journal is in an earlier format.
    Whether anything was upgraded."""
    log_dir = Path(log_dir)
    journal = log_dir / JOURNAL
    old_run = any(key not in previous for key in (RUN_ID, "adapter")) or any(
        isinstance(previous.get(part), dict) and "endpoint" not in previous[part] for part in LM_PARTS
    )
    old_journal = not journal_is_current(journal)
    if not (old_run or old_journal):
        return False
    kept = log_dir / PRE_MIGRATION
    originals = {RUN_FILE: (log_dir / RUN_FILE).read_bytes()}
    if old_journal:
        originals[JOURNAL] = journal.read_bytes()
    for name, data in originals.items():
        if not (kept / name).exists():  # a migration cut short keeps the first originals, not its own output
            atomic_write_bytes(kept / name, data)
    atomic_write_json(log_dir / RUN_FILE, current)
    if old_journal:
        atomic_write_bytes(journal, upgraded_journal(originals[JOURNAL], current[RUN_ID]))
    logger.info("%s was written by an earlier version: upgraded, the originals kept in %s", log_dir, kept)
    return True
