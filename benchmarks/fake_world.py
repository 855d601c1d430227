"""A rule-based fake "world" for the benchmark programs, for tests and ``--task-lm fake`` dry runs.

Task predictors misbehave on part of the data unless their instruction carries a fix token
``FIX-<output field>`` (or AgentGrad's per-example hint): the answerer answers the gold answer,
the query writers name the gold titles, the IFBench rewriter repeats the query's own words, MATH's
solver drafts the reference answer and its verifier keeps the draft unless fixed. The prompt-LM roles
of all four optimizers (AgentGrad's gradient / cluster / rewrite signatures, GEPA's reflection --
dspy's JSON-adapter proposer or gepa's raw prompt --, MIPROv2's grounded proposer, TextGrad's
feedback and TGD update prompts) reply with the current instruction plus the fix token of the
predictor they are asked about, so every optimizer can find the improvement.
"""

from __future__ import annotations

import json
import re
import threading
import zlib
from collections import Counter
from collections.abc import Iterable

from dspy_agentgrad.testing import FakeCall

TASK_FIELDS = ("answer", "draft_answer", "query", "summary", "response", "final_response", "llm_request")
JUDGE_FIELDS = ("judgment", "num_pii_leaked")
#: PUPA's two trusted steps (their output fields).
PUPA_FIELDS = ("llm_request", "response")
#: The input field that names an example, per benchmark.
INPUT_KEYS = ("question", "claim", "query", "user_query", "problem")
#: A response the fake judge finds worse than any real one.
POOR_RESPONSE = "ok"
_PRODUCES = re.compile(r"produce the fields? `(\w+)`")


def fix_token(field: str) -> str:
    return f"FIX-{field}"


def _stable(text: str) -> int:
    return zlib.crc32(text.encode("utf-8"))


def _field_of(instruction: str) -> str | None:
    """Which predictor an instruction belongs to: its first output field, or a fix token."""
    match = _PRODUCES.search(instruction)
    if match:
        return match.group(1)
    for field in TASK_FIELDS:
        if fix_token(field) in instruction:
            return field
    lowered = instruction.lower()
    for keyword, field in _KEYWORDS:
        if keyword in lowered:
            return field
    return None


#: Words of the benchmarks' seed instructions that tell which predictor an instruction belongs to.
_KEYWORDS = (
    ("final response", "final_response"),
    ("constraint", "final_response"),
    ("respond to the query", "response"),
    ("answer the user's query", "response"),
    ("private", "llm_request"),
    ("check a draft", "answer"),
    ("solve the math", "draft_answer"),
)


def _redact(text: str, units: list[str]) -> str:
    for unit in sorted(units, key=len, reverse=True):
        text = re.sub(re.escape(unit), "[REDACTED]", text, flags=re.IGNORECASE)
    return text


def _pii_list(text: str) -> list[str]:
    try:
        value = json.loads(text)
    except (TypeError, ValueError):
        return [p.strip() for p in str(text).split("||") if p.strip()]
    return [str(v) for v in value] if isinstance(value, list) else [str(value)]


class BenchWorld:
    """The rule behind the fake LM (``fake_lm(BenchWorld(examples))``); thread-safe.

    examples: every example the program may see (any benchmark); the world looks gold labels up by
        the program's input text. ``easy_every``: one example in this many behaves without a fix.
    """

    def __init__(self, examples: Iterable, easy_every: int = 3):
        self.gold: dict[str, object] = {}
        for ex in examples:
            for key in INPUT_KEYS:
                if ex.get(key):
                    self.gold[str(ex.get(key)).strip()] = ex
        self.easy_every = easy_every
        self.calls: Counter[str] = Counter()
        self._lock = threading.Lock()

    def _count(self, what: str) -> None:
        with self._lock:
            self.calls[what] += 1

    # -- task predictors -------------------------------------------------------------------------
    def _fixed(self, call: FakeCall, field: str, key: str) -> bool:
        if fix_token(field) in call.instructions or call.hint is not None:
            return True
        if field in PUPA_FIELDS:  # one faulty step per example (or none), so one hinted step can fix it
            return (None, *PUPA_FIELDS)[_stable(key) % (len(PUPA_FIELDS) + 1)] != field
        return _stable(key) % self.easy_every == 0

    def _task(self, call: FakeCall) -> dict:
        key = next((call.inputs[k] for k in INPUT_KEYS if call.inputs.get(k)), "").strip()
        ex = self.gold.get(key)
        out = {"reasoning": "Step by step."}
        for field in call.output_fields:
            if field == "reasoning":
                continue
            self._count(field)
            good = ex is not None and self._fixed(call, field, key)
            if field == "summary":
                out[field] = (call.inputs.get("passages", "") + " " + call.inputs.get("context", ""))[:1500]
            elif field == "query":
                titles = list(ex.get("gold_titles") or ex.get("titles") or []) if ex is not None else []
                out[field] = " ".join(titles) if good and titles else key
            elif field == "answer" and "draft_answer" in call.inputs:  # MATH's verifier keeps an unchecked draft
                out[field] = str(ex.get("answer")) if good else call.inputs["draft_answer"]
            elif field in ("answer", "draft_answer"):
                out[field] = str(ex.get("answer")) if good else "unknown"
            elif field == "response" and "related_llm_response" in call.inputs:  # PUPA's final response
                out[field] = "In short: " + str(ex.get("target_response"))[:200] if good else POOR_RESPONSE
            elif field == "response":
                out[field] = "Draft: " + key[:200]
            elif field == "llm_request":  # PUPA: the query without its PII units, or the private query itself
                out[field] = _redact(key, _pii_list(str(ex.get("pii_str") or ""))) if good else key
            elif field == "final_response":
                out[field] = key if good else "ok"
            else:
                out[field] = "ok"
        return out

    # -- PUPA's untrusted model and judge ----------------------------------------------------------
    def _untrusted(self, call: FakeCall) -> str:
        self._count("untrusted")
        return "Here is some help with: " + call.user[:200]

    def _judge(self, call: FakeCall) -> dict:
        if "num_pii_leaked" in call.output_fields:
            self._count("judge_leakage")
            prompt = call.inputs.get("prompt", "").lower()
            leaked = sum(1 for unit in _pii_list(call.inputs.get("pii", "[]")) if unit.lower() in prompt)
            return {"reasoning": "Counted.", "num_pii_leaked": leaked}
        self._count("judge_quality")
        a, b = call.inputs.get("response_A", "").strip(), call.inputs.get("response_B", "").strip()
        return {"reasoning": "Compared.", "judgment": a != POOR_RESPONSE or b == POOR_RESPONSE}

    # -- optimizer roles -------------------------------------------------------------------------
    def _with_fix(self, instruction: str) -> str:
        field = _field_of(instruction)
        if field is None or fix_token(field) in instruction:
            return instruction
        return f"{instruction.rstrip()} {fix_token(field)}"

    def _gepa(self, call: FakeCall) -> str:
        self._count("gepa_reflection")
        blocks = call.user.split("```")
        current = blocks[1].strip() if len(blocks) > 2 else ""
        return f"```\n{self._with_fix(current)}\n```"

    def _gepa_dspy(self, call: FakeCall) -> str:
        """dspy.GEPA's built-in proposer (a ``ProposeInstruction`` predictor under the JSON adapter)."""
        self._count("gepa_reflection")
        return json.dumps({"new_instruction": self._with_fix(call.inputs.get("current_instruction", ""))})

    def _agentgrad(self, call: FakeCall) -> dict:
        current = call.inputs.get("current_instruction", "")
        field = _field_of(current) or _field_of(call.inputs.get("step_signature", "")) or "answer"
        if "clusters" in call.output_fields:
            self._count("agentgrad_abstract")
            members = [int(i) for i in re.findall(r"^\[(\d+)\]", call.inputs.get("gradients", ""), flags=re.M)]
            return {"clusters": [{"members": members, "generalized_gradient": f"Always apply {fix_token(field)}."}]}
        if "generalized_gradient" in call.output_fields:
            self._count("agentgrad_summarize")
            return {"generalized_gradient": f"Always apply {fix_token(field)}."}
        if "gradient" in call.output_fields:
            self._count("agentgrad_gradient")
            return {"gradient": f"Always apply {fix_token(field)}."}
        if "new_instruction" in call.output_fields:
            self._count("agentgrad_rewrite")
            return {"new_instruction": self._with_fix(current)}
        return {name: "ok" for name in call.output_fields}

    def _mipro(self, call: FakeCall) -> dict:
        self._count("mipro_propose")
        out = {name: "A program step." for name in call.output_fields}
        out["proposed_instruction"] = self._with_fix(call.inputs.get("basic_instruction", ""))
        return out

    def _textgrad(self, call: FakeCall) -> str:
        """TextGrad's backward engine (feedback) and TGD update (the variable plus the fix token)."""
        role = re.search(r"<ROLE>(.*?)</ROLE>", call.user, flags=re.S)
        written = re.search(r"writes ([\w, ]+)", role.group(1) if role else "")
        token = fix_token(written.group(1).split(",")[-1].strip()) if written else ""
        if "<IMPROVED_VARIABLE>" not in call.system:
            self._count("textgrad_gradient")
            return f"Add the rule {token} to the instruction." if token else "No change needed."
        self._count("textgrad_update")
        current = re.search(r"<VARIABLE>(.*?)</VARIABLE>", call.user, flags=re.S)
        value = current.group(1).strip() if current else ""
        fixed = value if not token or token in value else f"{value} {token}"
        return f"<IMPROVED_VARIABLE>{fixed}</IMPROVED_VARIABLE>"

    def __call__(self, call: FakeCall):
        if "optimization system" in call.system and not call.output_fields:
            return self._textgrad(call)
        if "I provided an assistant with the following instructions" in call.user:
            return self._gepa(call)
        if "examples_with_feedback" in call.inputs and "new_instruction" in call.output_fields:
            return self._gepa_dspy(call)
        if "current_instruction" in call.inputs:
            return self._agentgrad(call)
        if "proposed_instruction" in call.output_fields:
            return self._mipro(call)
        if any(f in JUDGE_FIELDS for f in call.output_fields):
            return self._judge(call)
        if any(f in TASK_FIELDS for f in call.output_fields):
            return self._task(call)
        if not call.output_fields and not call.system:
            return self._untrusted(call)
        self._count("other")
        return {name: "A short description." for name in call.output_fields}
