"""The embedded LM's thread count: every core while the rest of the machine is idle, half while it is busy,
chosen again before each generation (stubbed clocks and CPU counters; no model is loaded)."""

from __future__ import annotations

import sys
import types

import pytest

from dspy_agentgrad.embedded_lm import LlamaCppEngine, threads


class Machine:
    """CPU counters that advance as the test says: seconds of wall, of this process, of everything."""

    def __init__(self):
        self.wall = self.own = self.busy = 0.0

    def run(self, seconds: float, own_cores: float, other_cores: float) -> None:
        self.wall += seconds
        self.own += seconds * own_cores
        self.busy += seconds * (own_cores + other_cores)


def governor(machine: Machine, cores: int = 2, load: float = 0.0, monkeypatch=None) -> threads.ThreadGovernor:
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (load, load, load))
    return threads.ThreadGovernor(cores, lambda: machine.busy, lambda: machine.own, lambda: machine.wall)


def test_every_core_while_the_machine_is_otherwise_idle_and_half_while_something_else_runs(monkeypatch):
    machine = Machine()
    chosen = governor(machine, monkeypatch=monkeypatch)
    assert chosen.choose() == 2  # quiet at the start (load average 0)
    machine.run(5, own_cores=2, other_cores=0.0)
    assert chosen.choose() == 2
    machine.run(5, own_cores=1.4, other_cores=0.6)  # another process took 0.6 of a core
    assert chosen.choose() == 1
    machine.run(5, own_cores=1, other_cores=1)
    assert chosen.choose() == 1
    machine.run(5, own_cores=1, other_cores=0.05)  # it ended: back to every core
    assert chosen.choose() == 2


def test_a_busy_start_and_an_unreadable_machine_get_half_the_cores(monkeypatch):
    assert governor(Machine(), cores=4, load=1.5, monkeypatch=monkeypatch).choose() == 2
    assert governor(Machine(), cores=4, load=0.1, monkeypatch=monkeypatch).choose() == 4
    unknown = threads.ThreadGovernor(8, lambda: None, lambda: 0.0, lambda: 0.0)
    assert unknown.choose() == 4 and unknown.fewest == 4 and unknown.most == 4  # at most 4 either way
    assert threads.ThreadGovernor(1, lambda: None).choose() == 1


def test_the_count_is_set_on_the_context_only_when_it_changes(monkeypatch):
    calls = []
    monkeypatch.setitem(sys.modules, "llama_cpp", types.SimpleNamespace(llama_set_n_threads=lambda *a: calls.append(a)))
    machine = Machine()
    chosen = governor(machine, monkeypatch=monkeypatch)
    llama = types.SimpleNamespace(_ctx=types.SimpleNamespace(ctx="ctx"))

    def apply(context) -> int:
        n = chosen.choose()
        threads.set_threads(context, n)
        return n

    assert apply(llama) == 2 and calls == [("ctx", 2, 2)]
    machine.run(1, own_cores=2, other_cores=0)
    apply(llama)
    assert calls == [("ctx", 2, 2)]
    machine.run(1, own_cores=1, other_cores=1)
    assert apply(llama) == 1 and calls[-1] == ("ctx", 1, 1)
    apply(types.SimpleNamespace())  # a stand-in without a llama.cpp context is left alone
    assert len(calls) == 2


def test_machine_busy_seconds_reads_proc_stat(monkeypatch, tmp_path):
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 10 50 1000 40 5 5 30 0 0\ncpu0 50 5 25 500 20 2 3 15 0 0\n")
    real_open = open
    monkeypatch.setattr("builtins.open", lambda path, *a, **k: real_open(stat if path == "/proc/stat" else path))
    monkeypatch.setattr(threads.os, "sysconf", lambda name: 100)
    assert threads.machine_busy_seconds() == pytest.approx((100 + 10 + 50 + 5 + 5 + 30) / 100)


@pytest.mark.parametrize(("given", "governed"), [(None, True), (2, False)])
def test_only_an_unset_thread_count_is_governed_and_the_choice_survives_save_and_load(given, governed):
    engine = LlamaCppEngine("smollm2-135m", n_threads=given)
    again = LlamaCppEngine.load_state(engine.dump_state())
    assert (engine.load_settings["n_threads"] is None) is governed
    assert again.load_settings["n_threads"] == given
    assert engine.lm_name() == LlamaCppEngine("smollm2-135m", n_threads=3).lm_name()  # never part of the name
