"""A rule-based fake LM engine for deterministic tests and offline demos.

DSPy 3.4 runs custom LMs through an *engine* (``dspy.LM("fake/m", engine=E())``).
``RuleEngine`` parses DSPy's chat-adapter prompt back into a :class:`FakeCall`
(instructions, input values, requested output fields) and hands it to a plain
Python function that returns the output field values. This lets a test script
a whole "world": which instruction makes a predictor answer correctly, which
hint fixes it, what the optimizer's own LM roles reply.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import dspy
from dspy.lm15 import Message, RateLimitError, Response, TextPart, Usage
from dspy.lm15 import TimeoutError as LMTimeout

from ..program import prompt_text
from ..program.hint_delivery import HINT_FIELD, HINT_HEADER
from ..program.hints import PLACEBOS


@dataclass
class FakeCall:
    """One LM call as a rule sees it."""

    system: str
    user: str
    instructions: str
    inputs: dict[str, str]
    output_fields: list[str]
    demos: list[dict[str, str]] = field(default_factory=list)

    @property
    def hint(self) -> str | None:
        """The intervention hint this call carries, however it was delivered (input field or instruction).

        A placebo (:data:`hints.PLACEBOS`) tells nothing, so a rule sees no hint; its text stays in the prompt."""
        if HINT_FIELD in self.inputs:
            text = self.inputs[HINT_FIELD]
        elif HINT_HEADER in self.instructions:
            text = self.instructions.split(HINT_HEADER, 1)[1].strip()
        else:
            return None
        return None if any(text == p.text for p in PLACEBOS) else text


Rule = Callable[[FakeCall], "dict[str, Any] | str"]


def parse_call(system: str, user: str, history: list[tuple[str, str]] = ()) -> FakeCall:
    """Rebuild what a predictor asked for from the chat-adapter messages; ``history``: the (user, assistant)
    message pairs before the last user message, which is where the adapter puts a predictor's demos."""
    fields = [name for name, _ in prompt_text.output_fields(system)]
    demos = [{**prompt_text.input_values(asked), **prompt_text.output_values(answered)} for asked, answered in history]
    return FakeCall(system, user, prompt_text.instructions(system), prompt_text.input_values(user), fields, demos)


def _format(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value)


def _response(text: str, prompt_tokens: int, completion_tokens: int) -> Response:
    return Response(
        id=None,
        model="fake",
        message=Message.assistant([TextPart(text)]),
        finish_reason="stop",
        usage=Usage(
            input_tokens=prompt_tokens, output_tokens=completion_tokens, total_tokens=prompt_tokens + completion_tokens
        ),
    )


class RuleEngine:
    """A DSPy 3.4 engine whose replies come from ``rule(call)``.

    ``rule`` returns a dict of output field values (missing fields are filled
    with ``""``) or a raw string sent back as is (to simulate garbage).
    Raising inside ``rule`` simulates an LM error. Token usage is reported as
    whitespace word counts so that budgets and tables have real numbers.
    """

    def __init__(self, rule: Rule):
        self.rule = rule
        self.calls = 0
        self._lock = threading.Lock()

    def complete(self, request) -> Response:
        system = request.system if isinstance(request.system, str) else "".join(p.text for p in (request.system or []))
        user_messages = [m for m in request.messages if m.role == "user"]
        user = user_messages[-1].text if user_messages else ""
        earlier = request.messages[: len(request.messages) - 1] if user_messages else []
        history = [(a.text or "", b.text or "") for a, b in zip(earlier[::2], earlier[1::2]) if b.role == "assistant"]
        with self._lock:
            self.calls += 1
        call = parse_call(system or "", user or "", history)
        reply = self.rule(call)
        if isinstance(reply, str):
            text = reply
        else:
            fields = call.output_fields or list(reply)
            text = "".join(f"[[ ## {name} ## ]]\n{_format(reply.get(name, ''))}\n\n" for name in fields)
            text += "[[ ## completed ## ]]"
        prompt_tokens = len((system or "").split()) + len((user or "").split())
        return _response(text, prompt_tokens, len(text.split()))

    def __getstate__(self) -> dict:
        """Picklable (the lock stays behind): a fake LM can be sent to a Ray worker like a real one."""
        return {k: v for k, v in self.__dict__.items() if k != "_lock"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def stream(self, request):
        raise NotImplementedError("RuleEngine does not stream")

    def close(self) -> None:
        pass


def fake_lm(rule: Rule | RuleEngine, name: str = "fake/rules", num_retries: int = 0) -> dspy.LM:
    """A ``dspy.LM`` answering with ``rule`` (or a ready engine), with DSPy's cache off and, unless
    ``num_retries`` says otherwise, its retries off."""
    engine = rule if isinstance(rule, RuleEngine) else RuleEngine(rule)
    return dspy.LM(name, engine=engine, cache=False, num_retries=num_retries)


class FaultyEngine(RuleEngine):
    """A :class:`RuleEngine` that fails on a chosen fraction of calls, for fault-injection tests.

    A prompt is faulty when a hash of its text (and ``seed``) falls under ``rate``;
    it fails the first ``failures_per_prompt`` times it is sent and succeeds after,
    the way a rate limit or a flaky connection behaves. ``kind`` is
    ``"rate_limit"``, ``"timeout"`` or ``"garbage"`` (a reply with no fields).
    """

    KINDS = ("rate_limit", "timeout", "garbage")

    def __init__(self, rule: Rule, rate: float, kind: str, seed: int = 0, failures_per_prompt: int = 1):
        if kind not in self.KINDS:
            raise ValueError(f"kind must be one of {self.KINDS}; got {kind!r}")
        super().__init__(rule)
        self.rate, self.kind, self.seed, self.failures_per_prompt = rate, kind, seed, failures_per_prompt
        self.faults = 0
        self._sent: dict[str, int] = {}

    def complete(self, request) -> Response:
        text = json.dumps([str(request.system), [m.text for m in request.messages]])
        key = hashlib.sha256(f"{self.seed}:{text}".encode()).hexdigest()
        with self._lock:
            sent = self._sent.get(key, 0)
            self._sent[key] = sent + 1
            faulty = int(key[:8], 16) / 0xFFFFFFFF < self.rate and sent < self.failures_per_prompt
            self.faults += faulty
        if not faulty:
            return super().complete(request)
        # retry_after=0: a DSPy LM that retries (num_retries) does so at once
        if self.kind == "rate_limit":
            raise RateLimitError("injected rate limit", retry_after=0.0)
        if self.kind == "timeout":
            raise LMTimeout("injected timeout", retry_after=0.0)
        return _response("this reply has no fields at all", 0, 7)
