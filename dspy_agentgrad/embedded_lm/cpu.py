"""What the CPU under llama.cpp advertises, and the one load setting that depends on it.

llama.cpp repacks a model's weights into "extra buffer types" at load time when the CPU backend offers one
for them (AMX tiles on Intel Sapphire/Granite Rapids, interleaved layouts elsewhere). The AMX path segfaults
on the first decode on virtualized Sapphire/Granite Rapids machines (ggml-org/llama.cpp#20824; DSPy's CI and
ollama hit the same crash), which is where cloud VMs and CI runners often are. So the embedded LM loads the
model without extra buffer types wherever the CPU advertises AMX.
"""

from __future__ import annotations

import sys
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")


def cpu_flags() -> frozenset[str]:
    """The CPU feature flags the kernel reports (Linux ``/proc/cpuinfo``); empty where they cannot be read."""
    try:
        text = CPUINFO.read_text(errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def notable_flags(flags: frozenset[str] | None = None) -> str:
    """The flags that matter to llama.cpp's CPU kernels (AMX, AVX-512), for error messages; "none" if absent."""
    flags = cpu_flags() if flags is None else flags
    shown = sorted(f for f in flags if f.startswith(("amx", "avx512")))
    return " ".join(shown) if shown else f"no AMX or AVX-512 flags ({sys.platform})"


def use_extra_buffers(flags: frozenset[str] | None = None) -> bool:
    """Whether llama.cpp may repack weights into its extra CPU buffer types.

    False where the CPU advertises AMX (any ``amx*`` flag): the AMX matrix-multiply path crashes there on
    virtualized CPUs (ggml-org/llama.cpp#20824), and switching the extra buffers off cost nothing measurable
    on the packaged models (docs/embedded-lm.md). True elsewhere, which is llama.cpp's own default.
    """
    flags = cpu_flags() if flags is None else flags
    return not any(flag.startswith("amx") for flag in flags)
