"""Runs the main job in a child process, so that a native crash ends it with one clear line, not a bare exit 139.

The embedded LM is llama.cpp, native code: a fault in one of its CPU kernels kills the Python process with a
signal and no traceback. The parent process only waits and, when the child died from a signal, says what
happened and what to try.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from ..embedded_lm.cpu import notable_flags

CHILD = "AGENTGRAD_DEMO_CHILD"


def crash_message(signum: int, flags: frozenset[str] | None = None) -> str:
    """The one line printed when the job's process died from ``signum``."""
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    return (
        f"agentgrad demo: the job's process died with {name}, a crash in native code (most likely the embedded "
        f"LM, llama.cpp), not a Python error. CPU flags: {notable_flags(flags)}. Try `--extra-buffers off` "
        "(llama.cpp's AMX and repacked CPU kernels off), or an API model with --lm; "
        "if it persists, report this line."
    )


def run_supervised(args: list[str]) -> int:
    """Run ``demo ARGS`` in a child process and return its exit code (1 after a crash, with the message).
    The arguments are checked here first, so an error in them exits 2 before any process or LM call."""
    from .job import main, parse_args

    if os.environ.get(CHILD):
        main(["demo", *args])
        return 0
    parse_args(["demo", *args])
    child = subprocess.Popen([sys.executable, "-m", "dspy_agentgrad", "demo", *args], env={**os.environ, CHILD: "1"})
    try:
        code = child.wait()
    except KeyboardInterrupt:  # the child got the same Ctrl-C; let it finish writing
        code = child.wait()
    if code < 0 and -code not in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
        print(crash_message(-code), file=sys.stderr)
        return 1
    return 128 - code if code < 0 else code
