"""A rule-based fake LM engine for deterministic tests and offline demos.

DSPy 3.4 runs custom LMs through an *engine* (``dspy.LM("fake/m", engine=E())``).
``RuleEngine`` parses DSPy's chat-adapter prompt back into a :class:`FakeCall`
(instructions, input values, requested output fields) and hands it to a plain
Python function that returns the output field values. This lets a test script
a whole "world": which instruction makes a predictor answer correctly, which
hint fixes it, what the optimizer's own LM roles reply.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

import dspy
from dspy.lm15 import Message, Response, TextPart, Usage

_FIELD_HEADER = re.compile(r"\[\[ ## (\w+) ## \]\]")
_OBJECTIVE = "In adhering to this structure, your objective is:"


@dataclass
class FakeCall:
    """One LM call as a rule sees it."""

    system: str
    user: str
    instructions: str
    inputs: dict[str, str]
    output_fields: list[str]
    extras: dict[str, Any] = field(default_factory=dict)

    def has(self, text: str) -> bool:
        """True when ``text`` occurs in the instructions (case-insensitive)."""
        return text.lower() in self.instructions.lower()


Rule = Callable[[FakeCall], "dict[str, Any] | str"]


def _sections(text: str) -> dict[str, str]:
    """Split ``[[ ## name ## ]]`` delimited text into a name -> value dict."""
    parts = _FIELD_HEADER.split(text)
    values: dict[str, str] = {}
    for i in range(1, len(parts) - 1, 2):
        values[parts[i]] = parts[i + 1].strip()
    return values


def _output_fields(system: str) -> list[str]:
    block = system.split("Your output fields are:", 1)
    if len(block) < 2:
        return []
    block = block[1].split("All interactions will be structured", 1)[0]
    return re.findall(r"^\d+\. `(\w+)`", block, flags=re.M)


def parse_call(system: str, user: str) -> FakeCall:
    """Rebuild what a predictor asked for from the chat-adapter messages."""
    instructions = system.split(_OBJECTIVE, 1)[1].strip() if _OBJECTIVE in system else ""
    instructions = "\n".join(line.strip() for line in instructions.splitlines())
    inputs = _sections(user.split("\n\nRespond with the corresponding output fields", 1)[0])
    inputs.pop("completed", None)
    return FakeCall(system, user, instructions, inputs, _output_fields(system))


def _format(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value)


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
        with self._lock:
            self.calls += 1
        call = parse_call(system or "", user or "")
        reply = self.rule(call)
        if isinstance(reply, str):
            text = reply
        else:
            fields = call.output_fields or list(reply)
            text = "".join(f"[[ ## {name} ## ]]\n{_format(reply.get(name, ''))}\n\n" for name in fields)
            text += "[[ ## completed ## ]]"
        prompt_tokens = len((system or "").split()) + len((user or "").split())
        completion_tokens = len(text.split())
        return Response(
            id=None,
            model="fake",
            message=Message.assistant([TextPart(text)]),
            finish_reason="stop",
            usage=Usage(input_tokens=prompt_tokens, output_tokens=completion_tokens,
                        total_tokens=prompt_tokens + completion_tokens),
        )

    def stream(self, request):
        raise NotImplementedError("RuleEngine does not stream")

    def close(self) -> None:
        pass


def fake_lm(rule: Rule, name: str = "fake/rules") -> dspy.LM:
    """A ``dspy.LM`` backed by :class:`RuleEngine`, with DSPy's cache off."""
    return dspy.LM(name, engine=RuleEngine(rule), cache=False, num_retries=0)
