"""Reserving each LM request a user's code makes inside a prompt-LM role, before the request is sent.

AgentGrad's own roles know their prompt before they call the LM, so they reserve its worst case
against ``max_prompt_tokens`` / ``max_prompt_cost`` up front. A user's ``instruction_proposer`` is
a black box that may call any LM any number of times. DSPy offers no hook that can refuse a call
(its callbacks' exceptions are logged and swallowed), so every ``dspy.BaseLM`` request is routed
through :func:`_gated`, which does nothing unless a :class:`PromptGate` is set in DSPy's
settings for the current context. DSPy's own worker threads copy those settings, so a proposer's
``dspy.Parallel`` calls are reserved too. A subclass of ``dspy.BaseLM`` that overrides ``__call__``
itself is counted after the fact but not reserved.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import dspy

from .budget import Budget, BudgetExhausted, Reservation, completion_bound, estimated_tokens
from .usage import track

#: The DSPy settings key under which a gate travels with the context (and into DSPy's worker threads).
GATE_SETTING = "agentgrad_prompt_gate"
_install_lock = threading.Lock()


class PromptGate:
    """Reserves each LM request of one attempt of a role against the prompt-LM caps, and settles it."""

    def __init__(self, budget: Budget, key: str, price: Callable[[dict], float], batch: Any = None):
        self.budget = budget
        self.key = key
        self.price = price
        self.batch = batch
        self.refused: BudgetExhausted | None = None  # the cap that refused a request, even if the caller caught it
        self.settled_tokens = 0
        self.settled_cost = 0.0
        self._count = 0
        self._lock = threading.Lock()

    def admit(self, lm: Any, prompt: str | None, messages: list | None, kwargs: dict) -> Reservation | None:
        """Reserve the request's worst case: its whole prompt text and the most it may generate."""
        request = kwargs.get("request", None if prompt is None or isinstance(prompt, str) else prompt)
        if request is not None:  # a dspy.lm15.Request: its whole text, field names included, bounds its prompt
            text, limit = repr(request), getattr(getattr(request, "config", None), "max_tokens", None)
        else:
            shown = [str(m.get("content", "")) if isinstance(m, dict) else str(m) for m in messages or []]
            text = prompt or "".join(shown)
            limit = kwargs.get("max_tokens") or kwargs.get("max_completion_tokens")
        bound = {
            "prompt_tokens": estimated_tokens(text),
            "completion_tokens": int(limit) if isinstance(limit, int) and limit > 0 else completion_bound(lm),
        }
        with self._lock:
            self._count += 1
            key = f"{self.key}/request{self._count}"
        try:
            return self.budget.reserve(key, sum(bound.values()), self.price(bound), self.batch)
        except BudgetExhausted as refused:
            self.refused = refused
            raise

    def settle(self, reservation: Reservation | None, used: dict[str, int]) -> None:
        """Count what the request really used against the caps."""
        tokens = used["prompt_tokens"] + used["completion_tokens"]
        cost = self.price(used)
        self.budget.settle(reservation, tokens, cost)
        with self._lock:
            self.settled_tokens += tokens
            self.settled_cost += cost


@contextmanager
def _gated(lm: Any, prompt: str | None, messages: list | None, kwargs: dict) -> Iterator[None]:
    """Around one LM request: reserved and settled when a gate is set here, untouched otherwise."""
    gate: PromptGate | None = dspy.settings.get(GATE_SETTING)
    if gate is None:
        yield
        return
    reservation = gate.admit(lm, prompt, messages, kwargs)
    used: dict[str, int] = {}
    try:
        with track() as used:
            yield
    finally:
        gate.settle(reservation, used)


def install() -> None:
    """Route ``dspy.BaseLM`` requests through :func:`_gated` (once per process; a no-op where no gate is set)."""
    with _install_lock:
        if getattr(dspy.BaseLM.__call__, "_agentgrad_gated", False):
            return
        call, acall = dspy.BaseLM.__call__, dspy.BaseLM.acall

        def gated_call(self, prompt=None, *, messages=None, **kwargs):
            with _gated(self, prompt, messages, kwargs):
                return call(self, prompt, messages=messages, **kwargs)

        async def gated_acall(self, prompt=None, *, messages=None, **kwargs):
            with _gated(self, prompt, messages, kwargs):
                return await acall(self, prompt, messages=messages, **kwargs)

        gated_call._agentgrad_gated = True  # type: ignore[attr-defined]
        dspy.BaseLM.__call__ = gated_call
        dspy.BaseLM.acall = gated_acall
