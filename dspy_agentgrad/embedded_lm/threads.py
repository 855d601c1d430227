"""How many threads llama.cpp computes with: every core (at most 4) while the rest of the machine is idle, half
of them while something else wants the CPU.

The thread count never changes a token: llama.cpp gives each thread whole rows of a matrix product, so every
dot product is summed the same way. It changes the wall time a lot, both ways. On a 2-core Xeon VM (the main
job, seed 0, quiet machine) one thread took 257 s and two 184 s, with the same summary, because generating a
token is a pass over all the weights that two cores share. But llama.cpp's threads spin-wait for each other at
every step: with another process busy on one of the two cores, two threads took 172 ms a token against 20 ms
with one. So the count is chosen again before each generation, from the CPU time the rest of the machine used
since the previous one (``/proc/stat`` less this process's own time), and is half the cores where that cannot
be read (not Linux).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

#: Cores' worth of CPU the rest of the machine may use, on average since the last generation, for this process
#: still to take every core.
IDLE_OTHERS = 0.25
MAX_THREADS = 4


def machine_busy_seconds() -> float | None:
    """CPU seconds all processes have run (not idle, not waiting on I/O) since boot; None where unknown."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def own_busy_seconds() -> float:
    """CPU seconds this process has run, all its threads together."""
    times = os.times()
    return times.user + times.system


class ThreadGovernor:
    """Chooses llama.cpp's thread count before each generation from what the rest of the machine used."""

    def __init__(
        self,
        cores: int | None = None,
        machine: Callable[[], float | None] = machine_busy_seconds,
        own: Callable[[], float] = own_busy_seconds,
        clock: Callable[[], float] = time.monotonic,
    ):
        cores = cores or os.cpu_count() or 2
        self.most = max(1, min(cores, MAX_THREADS))
        self.fewest = max(1, min(cores // 2, MAX_THREADS))
        self._machine, self._own, self._clock = machine, own, clock
        self._last: tuple[float, float, float] | None = None
        self._lock = threading.Lock()

    def choose(self) -> int:
        """Every core when the others used under :data:`IDLE_OTHERS` cores since the last choice; else half.

        The first choice reads the 1-minute load average instead (no interval measured yet)."""
        machine = self._machine()
        if machine is None:
            return self.fewest
        with self._lock:
            now, own = self._clock(), self._own()
            last, self._last = self._last, (now, machine, own)
        if last is None or now - last[0] <= 0:
            return self.most if os.getloadavg()[0] < IDLE_OTHERS else self.fewest
        others = (machine - last[1] - (own - last[2])) / (now - last[0])
        return self.most if others < IDLE_OTHERS else self.fewest


def set_threads(llama: Any, n: int) -> None:
    """Give a loaded ``llama_cpp.Llama`` context ``n`` threads for its next decode calls."""
    context = getattr(getattr(llama, "_ctx", None), "ctx", None)  # None: not a llama.cpp context (a stand-in)
    if context is not None and getattr(llama, "_agentgrad_threads", None) != n:
        import llama_cpp

        llama_cpp.llama_set_n_threads(context, n, n)
        llama._agentgrad_threads = n


class CoreShare:
    """Splits the cores among the generations that run at once, one decode call at a time.

    Each decode takes ``cores // generations running`` threads, and waits until that many are not held by
    another generation's decode: when a second generation starts while the first decodes on every core, the
    first finishes its call on them and takes its share from its next call on, so the process never runs
    more llama.cpp threads than cores (spin-waiting threads on a shared core cost ten times their work).
    """

    def __init__(self, cores: int):
        self.cores = max(1, cores)
        self.running = 0
        self._held = 0
        self._changed = threading.Condition()

    @contextmanager
    def generation(self) -> Iterator[None]:
        """Count one generation as running for its whole length (prompt and every generated token)."""
        with self._changed:
            self.running += 1
        try:
            yield
        finally:
            with self._changed:
                self.running -= 1

    @contextmanager
    def decode(self, llama: Any, cores: int) -> Iterator[int]:
        """Hold ``cores // generations running`` threads (at least one) for one decode call on ``llama``."""
        with self._changed:
            n = max(1, min(cores, self.cores) // max(1, self.running))
            self._changed.wait_for(lambda: self._held + n <= self.cores)
            self._held += n
        try:
            set_threads(llama, n)
            yield n
        finally:
            with self._changed:
                self._held -= n
                self._changed.notify_all()


#: One per process: the machine's load is the same for every engine and context.
GOVERNOR = ThreadGovernor()
#: One per process: the cores are shared by every context of every loaded model.
CORES = CoreShare(GOVERNOR.most)
