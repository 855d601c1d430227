"""What one run of the program carries into every predictor call: its instructions, hints, the calls to
replay or reuse, the task-LM caps, and the record of its calls. It travels in DSPy's settings overrides under
:data:`CONTROL_KEY`, so every thread and copy DSPy makes of a predictor sees the run's own control."""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from ..runtime.budget import Budget, TaskCapReached
from ..runtime.jsonable import digest
from ..runtime.paid_work import AnswerJournal
from ..runtime.usage import empty_usage
from .program_state import ProgramState
from .runs import Step

CONTROL_KEY = "agentgrad_run"


def call_key(name: str, inputs: dict[str, Any], setting: str = "") -> str:
    """What tells a predictor's calls apart within a run: its inputs and call setting (replay, per-call hints)."""
    return f"{name}:{digest(inputs)}:{setting}"


#: Per-call arguments of ``Predict.forward`` that change its answer besides the inputs and the instruction.
CALL_SETTINGS = ("demos", "config", "lm")


def call_setting(kwargs: dict[str, Any]) -> str:
    """A digest of the call's own ``demos``, ``config`` and ``lm`` ("" when it passed none): two calls with the
    same inputs but other demos or settings are other calls, for replay and reuse alike."""
    given = {k: kwargs[k] for k in CALL_SETTINGS if kwargs.get(k) is not None}
    if "lm" in given:
        given["lm"] = getattr(given["lm"], "model", None) or type(given["lm"]).__name__
    return digest(given) if given else ""


class RunControl:
    """Per-run state shared by every thread the run uses; all mutation under one lock."""

    def __init__(
        self,
        instructions: ProgramState,
        hints: dict[str, str] | None = None,
        replay: Iterable[Step] = (),
        reuse: Iterable[Step] = (),
        budget: Budget | None = None,
        only: dict[str, str] | None = None,
        answers: AnswerJournal | None = None,
        run: str = "",
    ):
        """``instructions``: the program to run (instructions and added demonstrations); ``replay``: calls that
        must be replayed (a miss is counted); ``reuse``: calls that may be; ``budget``: the task-LM caps every
        live call is admitted against (None: no cap); ``only``: for a hinted predictor, the :func:`call_key` of
        the calls that get its hint (its other calls get none); ``answers``: where each answer is journaled as
        it arrives, under ``run`` (what determines this run), and found again after a resume."""
        self.instructions = instructions
        self.budget = budget
        self.answers = answers
        self.run = run
        self._occurrences: dict[str, int] = defaultdict(int)
        self.journaled_usage = empty_usage()  # of the answers read back from the journal
        self.capped: TaskCapReached | None = None  # a call was refused: the run must not be scored
        self.hints = dict(hints or {})
        self.only = dict(only or {})
        replay, reuse = [s for s in replay if not s.error], [s for s in reuse if not s.error]  # a failure runs anew
        self._lock = threading.Lock()
        self._replay: dict[str, list[Step]] = defaultdict(list)
        for step in replay + reuse:
            self._replay[call_key(step.name, step.inputs, step.setting)].append(step)
        self.replay_names = frozenset(step.name for step in replay)
        self.reuse_names = frozenset(step.name for step in reuse)
        self._next_call: dict[str, int] = defaultdict(int)
        self._sequence = 0
        self._recorded: list[tuple[int, Step]] = []
        self.replay_misses = 0
        self.predictor_errors: list[BaseException] = []

    def hint_for(self, name: str, key: str) -> str | None:
        """The hint of the call of ``name`` whose :func:`call_key` is ``key`` (None: the call gets none)."""
        if name in self.only and self.only[name] != key:
            return None
        return self.hints.get(name)

    def start_call(self, name: str) -> tuple[int, int]:
        """A run-wide sequence number and this predictor's call number."""
        with self._lock:
            sequence, call = self._sequence, self._next_call[name]
            self._sequence += 1
            self._next_call[name] += 1
        return sequence, call

    def answer_key(self, request: str) -> str:
        """The journal key of this run's next call of ``request`` (equal requests in a run are told apart by
        their order)."""
        with self._lock:
            occurrence = self._occurrences[request]
            self._occurrences[request] += 1
        return f"{self.run}:{request}:{occurrence}"

    def add_journaled(self, usage: dict[str, int]) -> None:
        """Count the usage of an answer read back from the journal as this run's (it was paid, earlier)."""
        with self._lock:
            for name in self.journaled_usage:
                number = usage.get(name, 0)
                self.journaled_usage[name] += int(number) if isinstance(number, (int, float)) else 0

    def take_replay(self, name: str, inputs: dict[str, Any], setting: str = "") -> Step | None:
        """The recorded call to hand back for this predictor, inputs and call setting, if one is left."""
        with self._lock:
            queue = self._replay.get(call_key(name, inputs, setting))
            return queue.pop(0) if queue else None

    def record(self, sequence: int, step: Step) -> None:
        """Keep a finished call, by its start order (threads may finish out of order)."""
        with self._lock:
            self._recorded.append((sequence, step))

    def missed_replay(self) -> None:
        """Count a call that should have been replayed but ran live (reported per run)."""
        with self._lock:
            self.replay_misses += 1

    def predictor_error(self, error: BaseException) -> None:
        """Keep an error a predictor raised, to tell the program's own bugs from LM errors."""
        with self._lock:
            self.predictor_errors.append(error)

    def steps(self) -> list[Step]:
        """The run's calls in start order."""
        with self._lock:
            return [step for _, step in sorted(self._recorded, key=lambda pair: pair[0])]
