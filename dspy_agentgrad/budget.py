"""The optimizer's budget: metric calls (program runs scored by the metric) and prompt-LM tokens.

Charging happens *before* work starts, so a run can never overshoot its cap,
whatever the number of threads.
"""

from __future__ import annotations

import threading


class BudgetExhausted(Exception):
    """Raised when the next step would exceed a budget cap; the run stops cleanly."""


class Budget:
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
        self._lock = threading.Lock()

    def remaining(self) -> float:
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

    def add_prompt_usage(self, tokens: int, cost: float = 0.0) -> None:
        with self._lock:
            self.prompt_tokens += tokens
            self.prompt_cost += cost

    def check_prompt_caps(self) -> None:
        """Stop before a prompt-LM call once its token or cost cap has been reached."""
        if self.max_prompt_tokens is not None and self.prompt_tokens >= self.max_prompt_tokens:
            raise BudgetExhausted(f"prompt-LM token budget: {self.prompt_tokens} of {self.max_prompt_tokens} used")
        if self.max_prompt_cost is not None and self.prompt_cost >= self.max_prompt_cost:
            raise BudgetExhausted(f"prompt-LM cost budget: ${self.prompt_cost:.4f} of ${self.max_prompt_cost:.4f} used")
