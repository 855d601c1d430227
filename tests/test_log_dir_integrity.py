"""A log_dir that is tampered with, half written or planted with links never fools a run or leaks through it:
full disks, edited journals, a missing run.json, symbolic links, options added since, the lock."""

from __future__ import annotations

import errno
import io
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import dspy
import pytest
from world import Pipeline, World, agentgrad, feedback_metric, make_data, world_lm

from dspy_agentgrad import AgentGrad, RunMismatch
from dspy_agentgrad.config import AgentGradConfig
from dspy_agentgrad.runtime.run_lock import LogDirBusy, LogDirLock
from dspy_agentgrad.runtime.store import LinkInLogDir

FAST = dict(auto=None, progress=False)
TRAIN = make_data({"extract": 3, "notes": 3, "answer": 2, "none": 2})
VAL = make_data({"extract": 2, "notes": 2, "answer": 2, "none": 2}, start=50)
OUTPUTS = ("optimized_program.json", "result.md", "report.html")


CALLS: list[int] = []  # one entry per metric call


def metric(gold, pred, trace=None, pred_name=None, pred_trace=None):
    CALLS.append(1)
    return feedback_metric(gold, pred, trace)


def compile_once(log_dir, **options):
    """A compile on ``log_dir``; returns the result and the metric calls it made."""
    dspy.configure(lm=world_lm(World()))
    optimizer = agentgrad(metric, log_dir=log_dir, **{"max_rounds": 2, **FAST, **options})
    CALLS.clear()
    return optimizer.compile(Pipeline(), trainset=TRAIN, valset=VAL).detailed_results, len(CALLS)


# ---- a full disk ----------------------------------------------------------------------------------------


class _FillingFile:
    """A file on a disk with ``room`` bytes left: a longer write writes what fits, then fails with ENOSPC."""

    def __init__(self, real, room: int):
        self._real, self._room = real, room

    def write(self, data):
        if len(data) > self._room:
            self._real.write(data[: self._room])
            self._real.flush()
            raise OSError(errno.ENOSPC, "No space left on device")
        self._room -= len(data)
        return self._real.write(data)

    def __getattr__(self, name):
        return getattr(self._real, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._real.close()


@pytest.fixture
def disk_fills_on(monkeypatch):
    """``disk_fills_on(folder, name, room)``: from now on, files written in ``folder`` whose name holds ``name``
    (temporary files named after them too) hit a full disk after ``room`` bytes; every other file is written."""

    def arm(folder: Path, name: str, room: int = 200) -> None:
        real_open = io.open

        def shimmed(file, mode="r", *args, **kwargs):
            handle = real_open(file, mode, *args, **kwargs)
            where = os.readlink(f"/proc/self/fd/{file}") if isinstance(file, int) else os.fspath(file)
            writing = any(flag in mode for flag in "wax+")
            if writing and Path(where).parent == folder and name in Path(where).name:
                return _FillingFile(handle, room)
            return handle

        monkeypatch.setattr(io, "open", shimmed)
        monkeypatch.setattr("builtins.open", shimmed)

    return arm


@pytest.mark.skipif(not Path("/proc/self/fd").exists(), reason="names open files through /proc")
@pytest.mark.parametrize("name", OUTPUTS)
def test_a_full_disk_while_an_output_is_rewritten_leaves_the_previous_file_whole(tmp_path, disk_fills_on, name):
    compile_once(tmp_path)
    before = (tmp_path / name).read_bytes()
    disk_fills_on(tmp_path, name)
    with pytest.raises(OSError, match="No space left"):
        compile_once(tmp_path)  # a resume of the finished run: it writes its outputs again
    assert (tmp_path / name).read_bytes() == before  # the previous file, whole
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # no temporary file left


# ---- the journal --------------------------------------------------------------------------------------


def _edit_scores(journal: Path, times: int) -> int:
    """Flip the scores of the first ``times`` failed runs in the journal to 1, as a hand edit would."""
    lines, edited = journal.read_text().splitlines(), 0
    for i, line in enumerate(lines):
        entry = json.loads(line)
        value = entry.get("value")
        if edited < times and isinstance(value, dict) and value.get("score") == 0.0 and "steps" in value:
            value["score"], value["feedback"] = 1.0, "correct"
            lines[i] = json.dumps(entry)
            edited += 1
    journal.write_text("\n".join(lines) + "\n")
    return edited


def test_an_edited_journal_record_is_reported_and_not_trusted(tmp_path, caplog):
    fresh, _ = compile_once(tmp_path / "fresh")
    edited = tmp_path / "edited"
    compile_once(edited, max_rounds=1)
    assert _edit_scores(edited / "memo.jsonl", 6) == 6
    with caplog.at_level(logging.WARNING, logger="dspy.agentgrad"):
        resumed, calls = compile_once(edited)
    assert "do not match their checksum" in caplog.text and "6 line(s)" in caplog.text
    assert resumed.initial_val_score == fresh.initial_val_score < 1.0  # the edits did not pass for results
    assert resumed.best_val_score == fresh.best_val_score
    assert resumed.final_instructions == fresh.final_instructions
    assert calls >= 6  # the edited runs were paid again


def test_records_appended_without_a_checksum_are_not_trusted(tmp_path, caplog):
    compile_once(tmp_path)
    journal = tmp_path / "memo.jsonl"
    records = [json.loads(line) for line in journal.read_text().splitlines()]
    forged = [{k: v for k, v in e.items() if k != "sum"} for e in records if "key" in e][:3]
    with journal.open("a") as handle:
        handle.writelines(json.dumps(e) + "\n" for e in forged)
    with caplog.at_level(logging.WARNING, logger="dspy.agentgrad"):
        compile_once(tmp_path)
    assert "3 line(s) do not match their checksum" in caplog.text


def test_a_journal_without_its_run_json_is_refused_naming_the_file(tmp_path):
    compile_once(tmp_path, max_rounds=1)
    (tmp_path / "run.json").unlink()
    with pytest.raises(RunMismatch, match=r"run\.json is missing.*memo\.jsonl holds the journal"):
        compile_once(tmp_path)
    assert not CALLS  # refused before anything was paid


# ---- symbolic links -----------------------------------------------------------------------------------


def test_links_planted_in_a_log_dir_are_replaced_never_written_through(tmp_path):
    log_dir, outside = tmp_path / "log", tmp_path / "outside"
    compile_once(log_dir, max_rounds=1)
    outside.mkdir()
    for name in (*OUTPUTS, "lock", "result.json", "state.json"):
        target = outside / name
        target.write_text("not yours to write")
        (log_dir / name).unlink(missing_ok=True)
        (log_dir / name).symlink_to(target)
    compile_once(log_dir)
    assert {p.name: p.read_text() for p in outside.iterdir()} == {
        name: "not yours to write" for name in (*OUTPUTS, "lock", "result.json", "state.json")
    }
    assert not any(p.is_symlink() for p in log_dir.iterdir())
    json.loads((log_dir / "optimized_program.json").read_text())


def test_a_journal_that_is_a_link_is_refused_and_left_alone(tmp_path):
    log_dir, elsewhere = tmp_path / "log", tmp_path / "elsewhere.jsonl"
    compile_once(log_dir, max_rounds=1)
    (log_dir / "memo.jsonl").rename(elsewhere)
    (log_dir / "memo.jsonl").symlink_to(elsewhere)
    before = elsewhere.read_bytes()
    with pytest.raises(LinkInLogDir, match=r"memo\.jsonl is a symbolic link"):
        compile_once(log_dir)
    assert elsewhere.read_bytes() == before


# ---- options added since a log_dir was written -----------------------------------------------------------


def test_options_added_since_at_their_neutral_default_are_no_difference(tmp_path):
    first, _ = compile_once(tmp_path)
    run = json.loads((tmp_path / "run.json").read_text())
    # every option is recorded, at its default too ...
    assert {"candidates", "max_demos", "reflect_hard_cases", "run_timeout_s", "objective_guards"} <= set(run["options"])
    # ... and a log_dir written before some existed (or when a run left out those at their default) lacks them
    left_out = ("max_task_calls", "max_task_tokens", "preset", "candidates", "max_demos", "reflect_hard_cases")
    for option in (*left_out, "run_timeout_s", "metric_timeout_s", "objective_guards"):
        run["options"].pop(option)
    (tmp_path / "run.json").write_text(json.dumps(run))
    again, calls = compile_once(tmp_path)
    assert calls == 0 and again.best_val_score == first.best_val_score
    (tmp_path / "run.json").write_text(json.dumps(run))
    with pytest.raises(RunMismatch, match=r"max_task_calls: \(not set\) -> 500"):
        compile_once(tmp_path, max_task_calls=500)  # a real change is still one


# ---- the lock ---------------------------------------------------------------------------------------------

HOLDER_WITH_CHILD = textwrap.dedent(
    """
    import os, sys, time
    from dspy_agentgrad.runtime.run_lock import LogDirLock
    lock = LogDirLock(sys.argv[1]).__enter__()
    child = os.fork()
    if child == 0:
        time.sleep(60)  # a helper process of the program, outliving the compile
        os._exit(0)
    print(child, flush=True)
    time.sleep(60)
    """
)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="forks a child")
def test_a_forked_child_outliving_a_killed_compile_does_not_hold_the_lock(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER_WITH_CHILD, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    child = int(holder.stdout.readline())
    try:
        with pytest.raises(LogDirBusy):
            LogDirLock(tmp_path).__enter__()
        holder.kill()
        holder.wait()
        os.kill(child, 0)  # the child still runs
        deadline = time.monotonic() + 10
        while True:
            try:
                with LogDirLock(tmp_path):
                    break
            except LogDirBusy:
                assert time.monotonic() < deadline, "the lock stayed held by the compile's child"
                time.sleep(0.1)
    finally:
        os.kill(child, signal.SIGKILL)


@pytest.mark.skipif(not Path("/proc/self/fd").exists(), reason="names open files through /proc")
def test_a_lock_note_that_cannot_be_written_releases_the_lock(tmp_path, disk_fills_on, monkeypatch):
    disk_fills_on(tmp_path, "lock", room=10)  # too little for the note
    with pytest.raises(OSError, match="No space left"):
        LogDirLock(tmp_path).__enter__()
    monkeypatch.undo()  # room on the disk again
    with LogDirLock(tmp_path):  # the same process tries again: the failed attempt holds nothing
        pass


# ---- settings that leave a run nothing to do ----------------------------------------------------------------


def test_robust_acceptance_with_one_validation_example_is_refused_saying_why(tmp_path):
    dspy.configure(lm=world_lm(World()))
    optimizer = AgentGrad(metric, val_acceptance="robust", config=AgentGradConfig.from_options(max_rounds=2, **FAST))
    CALLS.clear()
    with pytest.raises(ValueError, match="with 1 validation example no candidate can ever be kept"):
        optimizer.compile(Pipeline(), trainset=TRAIN, valset=VAL[:1])
    assert not CALLS


def test_a_metric_call_budget_below_one_validation_pass_says_why_nothing_happens(caplog):
    dspy.configure(lm=world_lm(World()))
    optimizer = AgentGrad(metric, max_metric_calls=5, config=AgentGradConfig.from_options(**FAST))
    CALLS.clear()
    with caplog.at_level(logging.WARNING, logger="dspy.agentgrad"):
        result = optimizer.compile(Pipeline(), trainset=TRAIN, valset=VAL).detailed_results
    assert "max_metric_calls=5 is less than one validation pass (8 validation examples" in caplog.text
    assert not CALLS and result.metric_calls == 0
