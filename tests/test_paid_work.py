"""Work paid once: the journal's memo across reloads, and one payment per key across threads."""

from __future__ import annotations

import json
import threading
import time

import pytest

from dspy_agentgrad.runtime.paid_work import PaidWork
from dspy_agentgrad.runtime.store import Memo


def test_memo_survives_a_reload_and_drops_a_torn_last_line(tmp_path):
    memo = Memo(tmp_path)
    memo.put("a", {"x": 1})
    memo.put("b", [1, 2])
    with open(tmp_path / "memo.jsonl", "a", encoding="utf-8") as handle:
        handle.write('{"key": "c", "val')
    again = Memo(tmp_path)
    assert again.loaded == 2 and again.get("a") == {"x": 1} and again.get("b") == [1, 2] and again.get("c") is None
    lines = (tmp_path / "memo.jsonl").read_text().splitlines()
    assert [json.loads(line)["key"] for line in lines if "key" in json.loads(line)] == ["a", "b"]


def test_paid_work_pays_once_per_key_even_when_threads_ask_together(tmp_path):
    paid = []

    def pay():
        paid.append(1)
        time.sleep(0.05)
        return {"v": 42}

    work = PaidWork(Memo(tmp_path), dict, dict)
    results = []
    threads = [threading.Thread(target=lambda: results.append(work.settle("k", pay))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(paid) == 1
    assert sorted(new for _, new in results) == [False, False, False, True]
    assert all(value == {"v": 42} for value, _ in results)
    resumed = PaidWork(Memo(tmp_path), dict, dict)
    assert resumed.settle("k", lambda: pytest.fail("paid again")) == ({"v": 42}, True)
    assert resumed.pending(["k", "j", "j"]) == ["j"]


def test_paid_work_lets_another_thread_retry_after_a_failed_payment(tmp_path):
    work = PaidWork(Memo(None), dict, dict)
    with pytest.raises(RuntimeError):
        work.settle("k", lambda: (_ for _ in ()).throw(RuntimeError("boom")))
    assert work.settle("k", lambda: {"ok": True}) == ({"ok": True}, True)
