"""The optimizer's budget: metric calls (program runs scored by the metric), prompt-LM tokens and cost,
and task-LM calls and tokens.

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

Beside the metric calls made (``metric_calls``) the budget keeps the runs' task-LM spend in the same unit
(``task_spend``): each run adds the share of its predictor calls it made anew (:attr:`.runs.Outcome.task_share`:
k of N calls, k/N; one for a run with nothing to reuse). A run that reuses an earlier run's calls spends less
than a metric call's worth; one that takes its reference's score makes no metric call but still spends the
calls it made again. With ``cap_task_spend`` the cap holds for both counts, each charged one per run before it
starts: the task-LM calls are then bounded as ``dspy.GEPA``'s are (about one per predictor and metric call)
without taking from the metric calls what reused runs save. Both counts are exact (:class:`~fractions.Fraction`)
and settled from each run's record alone, so they are the same at any thread count and after a resume.

Task-LM caps are hard too, whatever reuse saves or retries add: every live predictor call of a
program run is admitted before it starts, against what was paid plus the worst cases of the calls
in flight (calls and tokens: its prompt's estimate plus ``max_tokens``, twice when the adapter may
retry in another format). A call that could pass a cap waits while other calls are in flight (they
may leave room); when none is, it is refused, its run is dropped (not scored) and the run stops.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

#: The purpose whose set-aside metric calls the current context's charges draw on (see ``Budget.drawing_on``).
_DRAWING_ON: contextvars.ContextVar[str | None] = contextvars.ContextVar("agentgrad_drawing_on", default=None)


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


class TaskCapReached(BudgetExhausted):
    """A task-LM call could take the run past ``max_task_calls`` or ``max_task_tokens``."""


@dataclass
class TaskTicket:
    """A task-LM call admitted: its worst case, held until it is settled."""

    calls: int
    tokens: int


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
        max_task_calls: int | None = None,
        max_task_tokens: int | None = None,
        cap_task_spend: bool = False,
    ):
        self.max_metric_calls = max_metric_calls
        self.max_prompt_tokens = max_prompt_tokens
        self.max_prompt_cost = max_prompt_cost
        self.max_task_calls = max_task_calls
        self.max_task_tokens = max_task_tokens
        self.cap_task_spend = cap_task_spend
        self.metric_calls = 0  # metric calls made (scored runs)
        self.task_spend = Fraction(0)  # the runs' calls made anew, in metric calls (see ``settle_run``)
        self._aside: dict[str, int] = {}  # metric calls kept for one step each (see ``set_aside``)
        self.prompt_tokens = 0
        self.prompt_cost = 0.0
        self.task_calls = 0  # paid by admitted calls (task-LM calls outside the caps are not counted here)
        self.task_tokens = 0
        self._task_held = TaskTicket(0, 0)  # worst cases of the admitted calls in flight
        self._batches: dict[Any, _Batch] = {}
        self._lock = threading.Lock()
        self._task_settled = threading.Condition(self._lock)

    @property
    def task_capped(self) -> bool:
        return self.max_task_calls is not None or self.max_task_tokens is not None

    @property
    def prompt_capped(self) -> bool:
        return self.max_prompt_tokens is not None or self.max_prompt_cost is not None

    def _task_fits(self, ticket: TaskTicket, held: TaskTicket) -> bool:
        calls_ok = self.max_task_calls is None or self.task_calls + held.calls + ticket.calls <= self.max_task_calls
        tokens_ok = (
            self.max_task_tokens is None or self.task_tokens + held.tokens + ticket.tokens <= self.max_task_tokens
        )
        return calls_ok and tokens_ok

    def admit_task_call(self, ticket: TaskTicket) -> TaskTicket:
        """Hold ``ticket``'s worst case for a task-LM call about to start, or raise :class:`TaskCapReached`.
        Waits while the call fits only once calls in flight are settled."""
        with self._task_settled:
            while not self._task_fits(ticket, self._task_held):
                if self._task_held.calls == 0 or not self._task_fits(ticket, TaskTicket(0, 0)):
                    raise TaskCapReached(
                        f"task-LM budget: {self.task_calls} calls of {self.max_task_calls}, {self.task_tokens} "
                        f"tokens of {self.max_task_tokens} paid; the next call could take {ticket.calls} call(s) "
                        f"and {ticket.tokens} tokens"
                    )
                self._task_settled.wait()
            self._task_held = TaskTicket(self._task_held.calls + ticket.calls, self._task_held.tokens + ticket.tokens)
            return ticket

    def settle_task_call(self, ticket: TaskTicket, calls: int, tokens: int) -> None:
        """Record what an admitted task-LM call really used, and release its worst case."""
        with self._task_settled:
            self._task_held = TaskTicket(self._task_held.calls - ticket.calls, self._task_held.tokens - ticket.tokens)
            self.task_calls += calls
            self.task_tokens += tokens
            self._task_settled.notify_all()

    def charge_replayed_task(self, usage: dict[str, Any]) -> None:
        """Count task-LM usage paid by an earlier compile on this ``log_dir`` (a result read back from the
        journal) against the task-LM caps, as it counted when it was paid: a compile again on a run a cap
        stopped stops at the same point and pays nothing again."""
        if self.task_capped:
            tokens = int(usage.get("prompt_tokens", 0)) + int(usage.get("completion_tokens", 0))
            self.settle_task_call(TaskTicket(0, 0), int(usage.get("calls", 0)), tokens)

    @property
    def set_aside_calls(self) -> int:
        """Metric calls kept out of reach of every step (see :meth:`set_aside`)."""
        return sum(self._aside.values())

    @property
    def counted(self) -> tuple[Fraction, ...]:
        """What the metric-call cap holds for: the metric calls, and with ``cap_task_spend`` the task spend. Work
        that leaves them unchanged took nothing from the budget."""
        return (Fraction(self.metric_calls), self.task_spend) if self.cap_task_spend else (Fraction(self.metric_calls),)

    @property
    def spent(self) -> Fraction:
        """What the metric-call cap is checked against: the largest of the :attr:`counted` counts."""
        return max(self.counted)

    def remaining(self) -> Fraction | float:
        """Metric calls left for any step (infinite without a cap): what is set aside is not."""
        if self.max_metric_calls is None:
            return float("inf")
        return self.max_metric_calls - self.spent - self.set_aside_calls

    def set_aside(self, n: int, purpose: str = "stack") -> None:
        """Keep ``n`` metric calls for ``purpose`` out of reach of every other step until set aside again (0 gives
        them back): a waiting stack's validation pass stays paid for whatever the round before it spends, and a
        validation pass running beside a round gets the calls it would have had before the round."""
        with self._lock:
            self._aside[purpose] = n

    @contextmanager
    def drawing_on(self, purpose: str) -> Iterator[None]:
        """Charges made in this context (this thread and what it copies its context into) take ``purpose``'s
        set-aside calls first; what is left of them is given back at the end."""
        token = _DRAWING_ON.set(purpose)
        try:
            yield
        finally:
            _DRAWING_ON.reset(token)
            self.set_aside(0, purpose)

    def charge(self, n: int) -> None:
        """Take ``n`` metric calls, all or nothing."""
        with self._lock:
            purpose = _DRAWING_ON.get()
            own = min(n, self._aside.get(purpose, 0)) if purpose is not None else 0
            taken = self.spent + self.set_aside_calls - own
            if self.max_metric_calls is not None and taken + n > self.max_metric_calls:
                aside = self.set_aside_calls - own
                note = f" ({aside} set aside)" if aside else ""
                spend = f" (task spend {float(self.task_spend):.1f})" if self.cap_task_spend else ""
                raise BudgetExhausted(
                    f"metric-call budget: {self.metric_calls}{spend} of {self.max_metric_calls} used{note}, "
                    f"the next step needs {n}"
                )
            self.metric_calls += n
            self.task_spend += n
            if own:
                self._aside[purpose] -= own

    def refund(self, n: int) -> None:
        """Give back ``n`` charged runs that turned out not to be made."""
        with self._lock:
            self.metric_calls -= n
            self.task_spend -= n

    def settle_run(self, scored: bool, share: Fraction) -> None:
        """A run charged one of each is done: it keeps its metric call only if it was ``scored``, and ``share``
        (at most one) of its task spend."""
        with self._lock:
            self.metric_calls -= 0 if scored else 1
            self.task_spend += share - 1

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
#: ASCII characters per token assumed when estimating a prompt (fewer than real tokenizers average on English).
CHARS_PER_TOKEN = 3


def completion_bound(lm: Any) -> int:
    """The most completion tokens one call of ``lm`` can take: what a worst case must assume."""
    kwargs = getattr(lm, "kwargs", None) or {}
    bound = kwargs.get("max_tokens") or kwargs.get("max_completion_tokens")
    return int(bound) if isinstance(bound, (int, float)) and bound > 0 else DEFAULT_COMPLETION_BOUND


def estimated_tokens(text: str) -> int:
    """Tokens ``text`` can take: ASCII at ``CHARS_PER_TOKEN`` characters a token, and every other
    character at its UTF-8 length in bytes, a bound for byte-level BPE and byte-fallback tokenizers
    (cl100k takes up to 2.5 tokens for a rare Chinese character and 3 for an emoji, which a count of
    characters would miss; a common Chinese character takes about 1, so this bound is loose there)."""
    ascii_chars = sum(1 for c in text if c < "\x80")
    other_bytes = len(text.encode("utf-8", "surrogatepass")) - ascii_chars
    return -(-ascii_chars // CHARS_PER_TOKEN) + other_bytes


def task_ticket(lm: Any, signature: Any, inputs: dict[str, Any], demos: list | None = None) -> TaskTicket:
    """The worst case of one predictor call: one LM call, or two when the adapter may retry in JSON
    (dspy's ChatAdapter falls back to the JSONAdapter after a parse error); :func:`worst_case_usage`
    already counts the tokens of both requests, each with its demonstrations."""
    import dspy

    adapter = dspy.settings.adapter or dspy.ChatAdapter()
    retries = getattr(adapter, "use_json_adapter_fallback", False) and not isinstance(adapter, dspy.JSONAdapter)
    usage = worst_case_usage(lm, signature, inputs, demos)
    return TaskTicket(2 if retries else 1, usage["prompt_tokens"] + usage["completion_tokens"])


def worst_case_usage(lm: Any, signature: Any, inputs: dict[str, Any], demos: list | None = None) -> dict[str, int]:
    """A call's tokens at most: its formatted prompt (estimated from its whole text: instruction, inputs and
    ``demos``) plus the LM's ``max_tokens``, for each LM request the adapter may make (DSPy's ``ChatAdapter``
    asks again through its JSON adapter when it cannot parse a reply)."""
    import dspy

    adapter = dspy.settings.adapter or dspy.ChatAdapter()
    adapters = [adapter]
    if getattr(adapter, "use_json_adapter_fallback", False) and not isinstance(adapter, dspy.JSONAdapter):
        adapters.append(dspy.JSONAdapter())
    tokens = 0
    for each in adapters:
        try:
            messages = each.format(signature, demos=list(demos or []), inputs=inputs)
            text = "".join(str(m.get("content", "")) for m in messages)
        except Exception:  # an adapter that cannot format offline: count the raw text
            shown = [str(v) for v in inputs.values()] + [str(d) for d in demos or []]
            text = str(signature.instructions) + "".join(shown)
        tokens += estimated_tokens(text)
    return {"prompt_tokens": tokens, "completion_tokens": len(adapters) * completion_bound(lm)}
