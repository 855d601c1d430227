"""Grammar-constrained output for small local LMs, so DSPy's adapters always parse.

Tiny instruct models (135M-270M parameters) follow DSPy's ``[[ ## field ## ]]``
protocol only loosely: they skip fields, invent headers, write prose where an
int belongs and run to ``max_tokens``. The LM engine only sees chat messages, so
this module reads the *output fields of the signature being called* back out of
DSPy's adapter system message (``Your output fields are:`` with
``1. `name` (type): ...`` lines) and builds a llama.cpp GBNF grammar that admits
exactly the shape the adapter parses:

* ChatAdapter: ``[[ ## a ## ]]\\n<value>\\n\\n[[ ## b ## ]]\\n<value>\\n\\n[[ ## completed ## ]]``
  (one or two newlines before each header; no blank line inside a value)
  (one or two newlines before each header)
* JSONAdapter: ``{"a": <json value>, "b": <json value>}``

Every value is bounded (characters per str field, items per list, digits per
number), so one field cannot run away and starve the next. If generation still
stops at ``max_tokens`` before the grammar is complete, :meth:`OutputPlan.repair`
closes the output with the fields seen so far and typed defaults for the rest,
so a truncated reply still parses.

Nothing here needs llama.cpp: the grammar is plain text (tests check it with a
vocabulary-only llama.cpp load), and :meth:`OutputPlan.regex` is an equivalent
Python regular expression used for repair and for model-free tests.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field

from ..program.prompt_text import CHAT_MARK, output_fields
from ..program.prompt_text import adapter_format as detect_format

__all__ = [
    "GRAMMAR_VERSION",
    "FieldSpec",
    "OutputLimits",
    "OutputPlan",
    "parse_output_fields",
    "detect_format",
    "plan_for_messages",
]

# Bumped whenever the grammar or the repair changes what a model writes: it is
# part of the local LM's name, hence of DSPy's cache key.
GRAMMAR_VERSION = 2

# Field kinds the grammar knows; anything else becomes bounded free text
# ("text"), which may still fail the adapter's type check.
KINDS = ("str", "int", "float", "bool", "literal", "list", "text")


@dataclass(frozen=True)
class OutputLimits:
    """Size bounds that keep every field finite.

    ``str_chars`` caps a str field in characters (a 270M model writes about 4
    characters per token, so 600 characters is ~150 tokens); lists hold at most
    ``list_items`` items of at most ``item_chars`` characters.
    """

    str_chars: int = 600
    list_items: int = 8
    item_chars: int = 80
    digits: int = 12

    def tokens_for(self, fields: list[FieldSpec]) -> int:
        """A max_tokens budget large enough for the grammar to finish.

        Estimated at ~3 characters per token plus the field headers; the
        engine takes the smaller of this and the caller's ``max_tokens``.
        """
        total = 16
        for spec in fields:
            total += 12 + len(spec.name) // 2
            if spec.kind in ("str", "text"):
                total += self.str_chars // 3
            elif spec.kind == "list":
                total += self.list_items * (self.item_chars // 3 + 3)
            elif spec.kind == "literal":
                total += max(len(c) for c in spec.choices) // 2 + 4
            else:
                total += self.digits + 4
        return total


@dataclass(frozen=True)
class FieldSpec:
    """One output field as DSPy's adapter described it to the LM."""

    name: str
    type_text: str
    kind: str
    choices: tuple[str, ...] = ()  # literal: allowed values as the adapter prints them
    item_kind: str = "str"  # list: kind of the items (str, int, float, bool)
    json_choices: tuple[str, ...] = ()  # literal: the same values JSON-encoded


def classify(type_text: str) -> FieldSpec:
    """Map the adapter's printed type (``int``, ``list[str]``, ``Literal['a', 'b']``) to a field kind."""
    t = type_text.strip()
    base = {"str": "str", "int": "int", "float": "float", "bool": "bool"}
    if t in base:
        return FieldSpec("", t, base[t])
    m = re.fullmatch(r"(?:typing\.)?(?:list|List)\[(str|int|float|bool)\]", t)
    if m:
        return FieldSpec("", t, "list", item_kind=m.group(1))
    m = re.fullmatch(r"(?:typing\.)?Literal\[(.*)\]", t, flags=re.S)
    if m:
        try:
            values = ast.literal_eval("(" + m.group(1) + ",)")
        except (ValueError, SyntaxError):
            values = ()
        if values and all(isinstance(v, (str, int, float, bool)) for v in values):
            return FieldSpec(
                "",
                t,
                "literal",
                choices=tuple(str(v) for v in values),
                json_choices=tuple(json.dumps(v) for v in values),
            )
    return FieldSpec("", t, "text")


def parse_output_fields(system: str) -> list[FieldSpec]:
    """Output fields, in order, from a DSPy adapter system message ([] when absent)."""
    fields = []
    for name, type_text in output_fields(system):
        spec = classify(type_text)
        fields.append(FieldSpec(name, spec.type_text, spec.kind, spec.choices, spec.item_kind, spec.json_choices))
    return fields


# --------------------------------------------------------------------------- GBNF


def _lit(text: str) -> str:
    """A GBNF string literal."""
    return json.dumps(text, ensure_ascii=False)


def _bounded(unit: str, lo: int, hi: int) -> str:
    return f"{unit}{{{lo},{hi}}}"


_COMMON_RULES = {
    # One unit of a chat-format value. A value never contains "[[" (it cannot
    # forge the next field header), never a blank line, and no line starts
    # with "[": a newline followed by "[[" or by another newline can only be
    # the separator before the next header. Tiny models otherwise drift into
    # "[## 1]"-style pseudo headers and loop until max_tokens.
    "tc": r'tc ::= [^[\n\x00] | "[" [^[\n\x00] | "\n" [^[\n\x00 \t]',
    # First character: not blank, not "[" (a header), not "{" (tiny models copy
    # the adapter's "{field_name}" placeholder instead of answering).
    "tc0": r"tc0 ::= [^[{\x00 \t\r\n]",
    "jc": r'jc ::= [^"\\\x00-\x1f] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4})',
    "jc0": r'jc0 ::= [^"\\\x00-\x20] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4})',
    "ws": r"ws ::= [ \t\n]{0,2}",
}


class _Builder:
    def __init__(self, limits: OutputLimits):
        self.limits = limits
        self.rules: dict[str, str] = {}

    def need(self, *names: str) -> None:
        for n in names:
            self.rules.setdefault(n, _COMMON_RULES[n])

    def number(self, kind: str) -> str:
        d = self.limits.digits
        if kind == "int":
            return f'"-"? [0-9]{{1,{d}}}'
        return f'"-"? [0-9]{{1,{d}}} ("." [0-9]{{1,6}})?'

    def jstring(self, chars: int) -> str:
        self.need("jc", "jc0")
        if chars <= 1:
            return '"\\"" jc0? "\\""'
        return f'"\\"" (jc0 jc{{0,{chars - 1}}})? "\\""'

    def scalar(self, kind: str, json_mode: bool, chars: int) -> str:
        if kind in ("int", "float"):
            return f"({self.number(kind)})"
        if kind == "bool":
            return '("true" | "false")' if json_mode else '("True" | "False")'
        return self.jstring(chars)

    def value(self, spec: FieldSpec, json_mode: bool) -> str:
        lim = self.limits
        if spec.kind == "literal":
            options = spec.json_choices if json_mode else spec.choices
            return "(" + " | ".join(_lit(o) for o in options) + ")"
        if spec.kind == "list":
            self.need("ws")
            item = self.scalar(spec.item_kind, True, lim.item_chars)
            more = _bounded(f'("," ws {item})', 0, max(lim.list_items - 1, 0))
            return f'("[" ws ({item} {more})? ws "]")'
        if spec.kind in ("int", "float", "bool"):
            return self.scalar(spec.kind, json_mode, lim.digits)
        # str and free text
        if json_mode:
            return self.jstring(lim.str_chars)
        self.need("tc", "tc0")
        return f"(tc0 {_bounded('tc', 0, max(lim.str_chars - 1, 0))})"


@dataclass
class OutputPlan:
    """What one DSPy call must return: format, fields, grammar, token budget."""

    format: str  # "chat" | "json"
    fields: list[FieldSpec]
    limits: OutputLimits = field(default_factory=OutputLimits)

    # ------------------------------------------------------------- grammar
    def gbnf(self) -> str:
        """The llama.cpp grammar admitting exactly what the adapter parses."""
        b = _Builder(self.limits)
        lines = []
        if self.format == "chat":
            parts = []
            for i, spec in enumerate(self.fields):
                lines.append(f"v{i} ::= {b.value(spec, json_mode=False)}")
                sep = "" if i == 0 else "sep "
                parts.append(f'{sep}{_lit(f"[[ ## {spec.name} ## ]]")} "\\n" v{i}')
            parts.append(f"sep {_lit(CHAT_MARK)}")
            b.rules["sep"] = 'sep ::= "\\n" "\\n"?'
            root = "root ::= " + " ".join(parts)
        else:
            b.need("ws")
            parts = ['"{" ws']
            for i, spec in enumerate(self.fields):
                lines.append(f"v{i} ::= {b.value(spec, json_mode=True)}")
                sep = "" if i == 0 else '"," ws '
                parts.append(f'{sep}{_lit(json.dumps(spec.name))} ws ":" ws v{i} ws')
            parts.append('"}"')
            root = "root ::= " + " ".join(parts)
        return "\n".join([root, *lines, *b.rules.values()]) + "\n"

    def forced_tail_stops(self) -> list[str]:
        """Stop strings that end generation where the rest of the reply is forced by the grammar.

        In the chat format a value never holds "[[", a blank line, or a line that starts with "[", so after the
        last value the first blank line or "\n[" can only open ``[[ ## completed ## ]]``, and "[[ ## completed"
        can only be that header. Generating those forced tokens one by one (about 7 per call, a sixth of what
        the main job generates) changes nothing the adapter parses: :meth:`repair` writes the same closing.
        """
        if self.format != "chat":
            return []
        return ["\n\n", "\n["] if len(self.fields) == 1 else [CHAT_MARK[:-6]]

    def max_tokens(self) -> int:
        """The most tokens this plan's fields can take: the generation cap for the call."""
        return self.limits.tokens_for(self.fields)

    # ------------------------------------------------------------- regex
    def _value_regex(self, spec: FieldSpec, json_mode: bool) -> str:
        lim = self.limits
        jc = r'(?:[^"\\\x00-\x1f]|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))'
        jc0 = r'(?:[^"\\\x00-\x20]|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))'

        def jstr(n: int) -> str:
            return f'"(?:{jc0}{jc}{{0,{max(n - 1, 0)}}})?"'

        def num(kind: str) -> str:
            d = lim.digits
            return f"-?[0-9]{{1,{d}}}" + ("" if kind == "int" else r"(?:\.[0-9]{1,6})?")

        def scalar(kind: str, jm: bool, n: int) -> str:
            if kind in ("int", "float"):
                return num(kind)
            if kind == "bool":
                return "(?:true|false)" if jm else "(?:True|False)"
            return jstr(n)

        if spec.kind == "literal":
            opts = spec.json_choices if json_mode else spec.choices
            return "(?:" + "|".join(re.escape(o) for o in opts) + ")"
        if spec.kind == "list":
            item = scalar(spec.item_kind, True, lim.item_chars)
            ws = r"[ \t\n]{0,2}"
            return rf"\[{ws}(?:{item}(?:,{ws}{item}){{0,{max(lim.list_items - 1, 0)}}})?{ws}\]"
        if spec.kind in ("int", "float", "bool"):
            return scalar(spec.kind, json_mode, lim.digits)
        if json_mode:
            return jstr(lim.str_chars)
        tc = r"(?:[^\[\n\x00]|\[[^\[\n\x00]|\n[^\[\n\x00 \t])"
        tc0 = r"[^\[{\x00 \t\r\n]"
        return f"{tc0}{tc}{{0,{max(lim.str_chars - 1, 0)}}}"

    def regex(self) -> str:
        """A Python regex equivalent to :meth:`gbnf` (full match)."""
        if self.format == "chat":
            parts = []
            for i, spec in enumerate(self.fields):
                sep = "" if i == 0 else r"\n\n?"
                parts.append(
                    f"{sep}{re.escape(f'[[ ## {spec.name} ## ]]')}\\n(?P<v{i}>{self._value_regex(spec, False)})"
                )
            parts.append(r"\n\n?" + re.escape(CHAT_MARK))
            return "".join(parts)
        ws = r"[ \t\n]{0,2}"
        parts = [r"\{" + ws]
        for i, spec in enumerate(self.fields):
            sep = "" if i == 0 else "," + ws
            parts.append(
                f"{sep}{re.escape(json.dumps(spec.name))}{ws}:{ws}(?P<v{i}>{self._value_regex(spec, True)}){ws}"
            )
        parts.append(r"\}")
        return "".join(parts)

    def matches(self, text: str) -> bool:
        """True when ``text`` is a complete output the grammar admits (trailing whitespace aside)."""
        return re.fullmatch(self.regex(), text.rstrip(), flags=re.S) is not None

    # ------------------------------------------------------------- repair
    def _default(self, spec: FieldSpec, json_mode: bool) -> str:
        if spec.kind == "literal":
            return (spec.json_choices if json_mode else spec.choices)[0]
        return {"int": "0", "float": "0.0", "bool": "false" if json_mode else "False", "list": "[]"}.get(
            spec.kind, '""' if json_mode else ""
        )

    def repair(self, text: str) -> str:
        """Close a generation cut off by ``max_tokens`` so the adapter still parses it.

        Complete fields are kept; a cut str field keeps its text so far; any
        other cut or missing field gets a typed default (0, False, [], the first
        Literal choice). A complete output is returned unchanged.
        """
        if self.matches(text):
            return text
        if self.format == "chat":
            values: dict[str, str] = {}
            # Values never contain "[[", so a trailing "[[..." is a header cut short.
            text = re.sub(r"\s*\[\[[^\n]*$", "", text.rstrip()) if not text.rstrip().endswith("]]") else text
            pieces = re.split(r"\[\[ ## (\w+) ## \]\]", text)
            for i in range(1, len(pieces) - 1, 2):
                values.setdefault(pieces[i], pieces[i + 1].strip().rstrip("["))
            out = []
            for spec in self.fields:
                v = values.get(spec.name, "")
                ok = re.fullmatch(self._value_regex(spec, False), v, flags=re.S) is not None
                if not ok and not (spec.kind in ("str", "text") and v):
                    v = self._default(spec, False)
                out.append(f"[[ ## {spec.name} ## ]]\n{v}")
            return "\n\n".join(out) + "\n\n" + CHAT_MARK
        # JSON: take each complete "name": value pair in order, default the rest.
        obj: dict[str, object] = {}
        rest = text
        for spec in self.fields:
            m = re.search(
                re.escape(json.dumps(spec.name)) + r"[ \t\n]*:[ \t\n]*(" + self._value_regex(spec, True) + ")",
                rest,
                flags=re.S,
            )
            if m:
                obj[spec.name] = json.loads(m.group(1))
                rest = rest[m.end() :]
            elif spec.kind in ("str", "text"):
                m = re.search(re.escape(json.dumps(spec.name)) + r'[ \t\n]*:[ \t\n]*"(.*)$', rest, flags=re.S)
                cut = m.group(1) if m else ""
                try:
                    obj[spec.name] = json.loads('"' + cut.rstrip("\\") + '"')
                except ValueError:
                    obj[spec.name] = ""
                rest = ""
            else:
                obj[spec.name] = json.loads(self._default(spec, True))
        return json.dumps(obj, ensure_ascii=False)


def plan_for_messages(system: str, limits: OutputLimits | None = None) -> OutputPlan | None:
    """The output plan for a DSPy adapter call, or None for a free-form prompt."""
    fmt = detect_format(system or "")
    if fmt is None:
        return None
    fields = parse_output_fields(system)
    if not fields:
        return None
    return OutputPlan(fmt, fields, limits or OutputLimits())
