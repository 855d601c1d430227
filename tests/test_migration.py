"""A ``log_dir`` written by an earlier version: upgraded once when a resume opens it, the originals kept, and
the run resumes with the decisions it would have reached."""

from __future__ import annotations

import json
import shutil

import dspy
import pytest
from test_run_identity import compile_once, decisions
from world import World, world_lm

from dspy_agentgrad import RunMismatch
from dspy_agentgrad.runtime.migration import PRE_MIGRATION, upgraded_journal
from dspy_agentgrad.runtime.store import Memo, sealed


def _journal(log_dir) -> list[dict]:
    return [json.loads(line) for line in (log_dir / "memo.jsonl").read_text().splitlines()]


def _write_journal(log_dir, entries: list[dict]) -> None:
    (log_dir / "memo.jsonl").write_text("".join(json.dumps(e) + "\n" for e in entries))


def _as_before_run_ids(log_dir) -> None:
    """Rewrite a finished ``log_dir`` as a version before run ids and checksums wrote it."""
    run = json.loads((log_dir / "run.json").read_text())
    for key in ("run_id", "adapter"):  # what that version did not record
        run.pop(key)
    for role in ("task_lm", "prompt_lm"):
        run[role].pop("endpoint")
    for option in ("max_task_calls", "max_task_tokens", "preset"):  # options added since, at their defaults
        run["options"].pop(option)
    (log_dir / "run.json").write_text(json.dumps(run))
    _write_journal(log_dir, [{k: v for k, v in e.items() if k not in ("run", "sum")} for e in _journal(log_dir)])


def test_a_log_dir_from_before_run_ids_is_upgraded_once_and_resumes_with_the_same_decisions(tmp_path):
    dspy.configure(lm=world_lm(World()))
    first = compile_once(tmp_path).detailed_results
    _as_before_run_ids(tmp_path)
    originals = {name: (tmp_path / name).read_bytes() for name in ("run.json", "memo.jsonl")}
    again = compile_once(tmp_path).detailed_results
    assert again.resumed and again.segments[-1]["metric_calls"] == 0  # every result replayed
    assert decisions(again) == decisions(first)
    kept = tmp_path / PRE_MIGRATION
    assert {name: (kept / name).read_bytes() for name in originals} == originals
    run = json.loads((tmp_path / "run.json").read_text())
    assert run["run_id"] and "adapter" in run and "endpoint" in run["task_lm"]
    (tmp_path / "check").mkdir()
    shutil.copy(tmp_path / "memo.jsonl", tmp_path / "check")
    memo = Memo(tmp_path / "check", run["run_id"])  # the current reader: every line sealed and this run's
    assert memo.untrusted == memo.foreign == memo.dropped == 0 and memo.loaded > 0
    memo.close()
    assert all(e["run"] == run["run_id"] for e in _journal(tmp_path) if "text" not in e)
    (kept / "run.json").unlink()
    (kept / "memo.jsonl").unlink()
    third = compile_once(tmp_path).detailed_results
    assert not any(kept.iterdir())  # a second open finds the current format: nothing upgraded again
    assert third.segments[-1]["metric_calls"] == 0 and decisions(third) == decisions(first)


def test_a_journal_with_run_ids_but_no_checksums_is_sealed_and_resumes(tmp_path):
    dspy.configure(lm=world_lm(World()))
    first = compile_once(tmp_path).detailed_results
    _write_journal(tmp_path, [{k: v for k, v in e.items() if k != "sum"} for e in _journal(tmp_path)])
    again = compile_once(tmp_path).detailed_results
    assert again.segments[-1]["metric_calls"] == 0 and decisions(again) == decisions(first)
    assert all("sum" in e for e in _journal(tmp_path))
    assert (tmp_path / PRE_MIGRATION / "memo.jsonl").exists() and (tmp_path / PRE_MIGRATION / "run.json").exists()


def test_an_upgrade_cut_short_after_run_json_is_finished_by_the_next_resume(tmp_path):
    dspy.configure(lm=world_lm(World()))
    first = compile_once(tmp_path).detailed_results
    run_id = json.loads((tmp_path / "run.json").read_text())["run_id"]
    _write_journal(tmp_path, [{k: v for k, v in e.items() if k not in ("run", "sum")} for e in _journal(tmp_path)])
    again = compile_once(tmp_path).detailed_results  # run.json already current, the journal not yet
    assert again.segments[-1]["metric_calls"] == 0 and decisions(again) == decisions(first)
    assert json.loads((tmp_path / "run.json").read_text())["run_id"] == run_id
    assert all(e["run"] == run_id for e in _journal(tmp_path) if "text" not in e)


def test_lines_an_earlier_version_did_not_trust_are_copied_as_they_are():
    old = {"key": "a", "value": 1, "at": 0.5}
    current = sealed({"key": "b", "value": 2, "at": 1.0, "run": "r"}).encode()
    appended = json.dumps({"key": "c", "value": 3}).encode() + b"\n"  # no checksum, after a sealed line
    raw = json.dumps(old).encode() + b"\n" + b"{damaged\n" + current + appended + b'{"key": "d", "va'
    upgraded = upgraded_journal(raw, "r")
    lines = upgraded.split(b"\n")
    assert lines[0] == sealed({**old, "run": "r"}).encode().rstrip(b"\n")
    assert upgraded.endswith(b"{damaged\n" + current + appended + b'{"key": "d", "va')


def test_a_refused_resume_upgrades_nothing(tmp_path):
    dspy.configure(lm=world_lm(World()))
    compile_once(tmp_path)
    _as_before_run_ids(tmp_path)
    originals = {name: (tmp_path / name).read_bytes() for name in ("run.json", "memo.jsonl")}
    with pytest.raises(RunMismatch, match=r"options\.seed"):
        compile_once(tmp_path, seed=7)
    assert {name: (tmp_path / name).read_bytes() for name in originals} == originals
    assert not (tmp_path / PRE_MIGRATION).exists()
