"""Reading DSPy's adapter prompt text back: the one parser shared by the embedded LM's
grammar builder and the rule-based fake LMs.

An LM engine only sees chat messages. Both the grammar (which must know the output
fields of the signature being called) and the fake engines (which must know the
instructions, the input values and the requested fields) recover them from the text
DSPy's ChatAdapter/JSONAdapter writes. Keeping that reading in one place means a change
in DSPy's prompt format is fixed once.
"""

from __future__ import annotations

import re

OUTPUT_BLOCK = "Your output fields are:"
BLOCK_END = "All interactions will be structured"
OBJECTIVE = "In adhering to this structure, your objective is:"
CHAT_MARK = "[[ ## completed ## ]]"
JSON_MARK = "Outputs will be a JSON object"
_FIELD_LINE = re.compile(r"^\s*\d+\. `(\w+)` \(", re.M)
_FIELD_HEADER = re.compile(r"\[\[ ## (\w+) ## \]\]")
_RESPOND = "\n\nRespond with the corresponding output fields"


def _closing_paren(text: str, start: int) -> int:
    """Index of the ``)`` closing the ``(`` just before ``start`` (quotes and brackets aware)."""
    depth, quote, i = 0, None, start
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            if depth == 0:
                return i
            depth -= 1
        i += 1
    return -1


def output_fields(system: str) -> list[tuple[str, str]]:
    """``(name, printed type)`` of each output field, in order ([] when the block is absent)."""
    if OUTPUT_BLOCK not in system:
        return []
    block = system.split(OUTPUT_BLOCK, 1)[1].split(BLOCK_END, 1)[0]
    fields = []
    for match in _FIELD_LINE.finditer(block):
        end = _closing_paren(block, match.end())
        if end >= 0:
            fields.append((match.group(1), block[match.end() : end]))
    return fields


def adapter_format(system: str) -> str | None:
    """``"chat"`` (ChatAdapter), ``"json"`` (JSONAdapter) or None (not a DSPy adapter prompt)."""
    if OUTPUT_BLOCK not in system:
        return None
    if JSON_MARK in system:
        return "json"
    if CHAT_MARK in system:
        return "chat"
    return None


def instructions(system: str) -> str:
    """The signature's instructions, one stripped line per line ("" when absent)."""
    text = system.split(OBJECTIVE, 1)[1].strip() if OBJECTIVE in system else ""
    return "\n".join(line.strip() for line in text.splitlines())


def sections(text: str) -> dict[str, str]:
    """Split ``[[ ## name ## ]]`` delimited text into a name -> value dict."""
    parts = _FIELD_HEADER.split(text)
    return {parts[i]: parts[i + 1].strip() for i in range(1, len(parts) - 1, 2)}


def input_values(user: str) -> dict[str, str]:
    """The input field values of a ChatAdapter user message."""
    values = sections(user.split(_RESPOND, 1)[0])
    values.pop("completed", None)
    return values


def output_values(assistant: str) -> dict[str, str]:
    """The output field values of a ChatAdapter assistant message (a demo's answer)."""
    values = sections(assistant)
    values.pop("completed", None)
    return values
