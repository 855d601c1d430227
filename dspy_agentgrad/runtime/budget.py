"""The optimizer's budget: metric calls (program runs scored by the metric) and prompt-LM tokens and cost.

Charging happens *before* work starts, so a run never overshoots a cap, whatever
the number of threads.

Prompt-LM caps are hard: before a call, its worst case (its prompt's estimated
tokens plus the LM's ``max_tokens``) is reserved; after it, the real usage is
settled. Calls made in one parallel batch (:func:`parallel.current_batch`) are
admitted against the usage settled *before* the batch plus the worst cases of the
batch's calls, so whether a batch is refused does not depend on the order or the
timing in which its calls finish: the same decisions at 1 and at 8 threads. (Which
calls of the refused batch were paid before the run stopped may differ; all of
them fit under the cap.)
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any


class BudgetExhausted(Exception):
    """Raised when the next step would exceed a budget cap; the run stops cleanly."""


class PromptCapReached(BudgetExhausted):
    """A prompt-LM call could exceed a token or cost cap; its message tells what was paid when it is read."""

    def __init__(self, budget: Budget, what: str, bound: float):
        super().__init__(what)
        self.budget, self.what, self.bound = budget, what, bound

    def __str__(self) -> str:
        b = self.budget
        if self.what == "tokens":
            return (
                f"prompt-LM token budget: {b.prompt_tokens} of {b.max_prompt_tokens} tokens paid; "
                f"the next call could take up to {self.bound:.0f} more"
            )
        return (
            f"prompt-LM cost budget: ${b.prompt_cost:.4f} of ${b.max_prompt_cost:.4f} paid; "
            f"the next call could cost up to ${self.bound:.4f} more"
        )


@dataclass
class _Batch:
    """Worst cases admitted and real usage settled for the calls of one parallel batch."""

    tokens_bound: int = 0
    cost_bound: float = 0.0
    tokens_paid: int = 0
    cost_paid: float = 0.0
    in_flight: int = 0
    keys: set[str] = field(default_factory=set)


@dataclass
class Reservation:
    """A handle on the parallel batch a prompt-LM call was admitted in, so its real usage settles there."""

    batch: Any


class Budget:
    """The run's caps (metric calls, prompt tokens, prompt USD): work is charged before it starts."""

    def __init__(
        self,
        max_metric_calls: int | None = None,
        max_prompt_tokens: int | None = None,
        max_prompt_cost: float | None = None,
    ):
        self.max_metric_calls = max_metric_calls
        self.max_prompt_tokens = max_prompt_tokens
        self.max_prompt_cost = max_prompt_cost
        self.metric_calls = 0
        self.prompt_tokens = 0
        self.prompt_cost = 0.0
        self._batches: dict[Any, _Batch] = {}
        self._lock = threading.Lock()

    def remaining(self) -> float:
        """Metric calls left (infinite without a cap)."""
        if self.max_metric_calls is None:
            return float("inf")
        return self.max_metric_calls - self.metric_calls

    def charge(self, n: int) -> None:
        """Take ``n`` metric calls, all or nothing."""
        with self._lock:
            if self.max_metric_calls is not None and self.metric_calls + n > self.max_metric_calls:
                raise BudgetExhausted(
                    f"metric-call budget: {self.metric_calls} of {self.max_metric_calls} used, the next step needs {n}"
                )
            self.metric_calls += n

    def refund(self, n: int) -> None:
        """Give back ``n`` charged metric calls that turned out not to be made."""
        with self._lock:
            self.metric_calls -= n

    def reserve(self, key: str, tokens_bound: int, cost_bound: float = 0.0, batch: Any = None) -> Reservation | None:
        """Admit a prompt-LM call of at most ``tokens_bound`` tokens (``cost_bound`` USD), or raise.

        ``batch`` groups the calls of one parallel step (``None``: a call on its own). A key already
        reserved in the batch is not reserved again (returns None).
        """
        batch = object() if batch is None else batch
        with self._lock:
            for other in [b for b, entry in self._batches.items() if b is not batch and entry.in_flight == 0]:
                del self._batches[other]  # finished batches: their usage counts as settled from now on
            entry = self._batches.setdefault(batch, _Batch())
            if key in entry.keys:
                return None
            tokens_before = self.prompt_tokens - entry.tokens_paid
            if self.max_prompt_tokens is not None and (
                tokens_before + entry.tokens_bound + tokens_bound > self.max_prompt_tokens
            ):
                raise PromptCapReached(self, "tokens", tokens_bound)
            cost_before = self.prompt_cost - entry.cost_paid
            if self.max_prompt_cost is not None and cost_before + entry.cost_bound + cost_bound > self.max_prompt_cost:
                raise PromptCapReached(self, "cost", cost_bound)
            entry.keys.add(key)
            entry.tokens_bound += tokens_bound
            entry.cost_bound += cost_bound
            entry.in_flight += 1
            return Reservation(batch)

    def settle(self, reservation: Reservation | None, tokens: int, cost: float = 0.0) -> None:
        """Record what an admitted call really used (0 when it was not paid in this run)."""
        with self._lock:
            self.prompt_tokens += tokens
            self.prompt_cost += cost
            if reservation is None:
                return
            entry = self._batches[reservation.batch]
            entry.tokens_paid += tokens
            entry.cost_paid += cost
            entry.in_flight -= 1


#: Completion tokens assumed for a prompt-LM call when its LM sets no ``max_tokens``.
DEFAULT_COMPLETION_BOUND = 4096
#: Characters per token assumed when estimating a prompt (fewer than real tokenizers average on English text).
CHARS_PER_TOKEN = 3


def completion_bound(lm: Any) -> int:
    """The most completion tokens one call of ``lm`` can take: what a worst case must assume."""
    kwargs = getattr(lm, "kwargs", None) or {}
    bound = kwargs.get("max_tokens") or kwargs.get("max_completion_tokens")
    return int(bound) if isinstance(bound, (int, float)) and bound > 0 else DEFAULT_COMPLETION_BOUND


def worst_case_usage(lm: Any, signature: Any, inputs: dict[str, Any]) -> dict[str, int]:
    """A call's tokens at most: its formatted prompt (estimated from its length) plus the LM's ``max_tokens``."""
    import dspy

    adapter = dspy.settings.adapter or dspy.ChatAdapter()
    try:
        messages = adapter.format(signature, demos=[], inputs=inputs)
        chars = sum(len(str(m.get("content", ""))) for m in messages)
    except Exception:  # an adapter that cannot format offline: count the raw text
        chars = len(str(signature.instructions)) + sum(len(str(v)) for v in inputs.values())
    return {"prompt_tokens": -(-chars // CHARS_PER_TOKEN), "completion_tokens": completion_bound(lm)}
