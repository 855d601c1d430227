import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import dspy
import pytest
from hypothesis import HealthCheck, Phase, settings

from dspy_agentgrad.runtime import retries

# Property tests over drawn worlds: "ci" (the default) draws the same 300 worlds per property on every run;
# HYPOTHESIS_PROFILE=dev draws 30 for a quick look (no shrinking), and =thorough 3,000 fresh ones.
_COMMON = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("ci", max_examples=300, derandomize=True, **_COMMON)
settings.register_profile("dev", max_examples=30, derandomize=True, phases=[Phase.generate], **_COMMON)
settings.register_profile("thorough", max_examples=3000, derandomize=False, **_COMMON)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# Tests marked real_lm run the embedded model's native code (llama.cpp). Each runs in a child pytest process, so
# that a native crash (a segfault in a CPU kernel) is one failed test naming the signal and the CPU flags, and the
# rest of the run still reports.
CHILD_REPORT = "AGENTGRAD_REAL_LM_REPORT"


@pytest.fixture(autouse=True)
def _no_retry_backoff(monkeypatch):
    """Retries of transient errors go at once: a test waits for no backoff."""
    monkeypatch.setattr(retries, "RETRY_BACKOFF_S", 0.0, raising=False)


@pytest.fixture(autouse=True)
def _no_lm_leaks_between_tests():
    """Each test configures its own LM; none leaks into the next."""
    yield
    dspy.configure(lm=None, adapter=None)


def _signal_name(returncode: int) -> str:
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    """Run a real_lm test in a child process (its outcome comes back through a small JSON file)."""
    if pyfuncitem.get_closest_marker("real_lm") is None or os.environ.get(CHILD_REPORT):
        return None
    from dspy_agentgrad.embedded_lm.cpu import notable_flags

    with tempfile.TemporaryDirectory() as folder:
        report = Path(folder) / "report.json"
        child = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--no-header", pyfuncitem.nodeid],
            cwd=str(pyfuncitem.config.rootpath),
            env={**os.environ, CHILD_REPORT: str(report)},
            capture_output=True,
            text=True,
        )
        outcome = json.loads(report.read_text()) if report.exists() else None
    if child.returncode < 0:
        pytest.fail(
            f"the real model crashed the test's process with {_signal_name(child.returncode)} "
            f"(CPU flags: {notable_flags()}); its last output:\n{child.stdout[-2000:]}{child.stderr[-2000:]}",
            pytrace=False,
        )
    if outcome is None:
        pytest.fail(f"the child test process wrote no outcome (exit {child.returncode}):\n{child.stdout[-3000:]}")
    if outcome["outcome"] == "skipped":
        pytest.skip(outcome["message"])
    if outcome["outcome"] != "passed":
        pytest.fail(f"in the child process:\n{outcome['message']}", pytrace=False)
    return True


def pytest_runtest_logreport(report):
    """In a child process: write the test's outcome (a failed setup or call wins over a later pass)."""
    if not os.environ.get(CHILD_REPORT) or (report.when != "call" and not (report.failed or report.skipped)):
        return
    path = Path(os.environ[CHILD_REPORT])
    if path.exists() and json.loads(path.read_text())["outcome"] != "passed":
        return
    message = str(report.longrepr[2]) if report.skipped and isinstance(report.longrepr, tuple) else report.longreprtext
    path.write_text(json.dumps({"outcome": report.outcome, "message": message}))
