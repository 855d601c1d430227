"""The simulated LM of the synthetic benchmark: task steps with latent defects, and one prompt-LM rule.

Task side. Step ``k`` produces the field ``note<k>`` (the last step produces ``answer``). Each
defect belongs to one step and is named after its field (``note1-b``). An example carries its
defects in an opaque ticket in the question (the prompt-LM rule never decodes it). A step whose
instruction lacks a defect's fix phrase (``RULE-<defect>``) breaks on the examples with that
defect: its output shows the symptom ``SYM-<defect>`` and loses the record key, so every later
step fails too. A hinted step behaves as if its own defects were fixed on a share ``hint_rate``
(default 80%) of the (example, step) pairs, never for upstream defects. Unfixable examples fail at the
last step with no symptom, whatever the instructions and hints. Demonstrations (any optimizer's) teach by
analogy: a step shown a demonstration of a correct output of its own on a case that carried one
of its defects behaves as if that defect were fixed on 50% of the (example, step) pairs.

Prompt side: ONE rule for every optimizer's prompt calls (AgentGrad's gradient / abstraction /
rewrite, GEPA's reflection in both of its prompt formats, MIPROv2's proposer). The rule finds the
predictor it is asked about (the ``produce the fields `X``` phrase of the instruction being
improved) and reads the rest of its input for symptoms of that predictor's defects. For every
symptom seen it proposes the matching fix: advice roles answer with advice naming symptom and fix,
instruction roles with the current instruction plus the missing fix phrases. With no symptom in
sight it proposes nothing new. Fix phrases alone (e.g. in a list of rejected rewrites) are not
evidence.

Overreach (``overreach``, default 0): that share of the defects, chosen by a hash of their names, have a fix
phrase that also makes its step over-strict: on the examples without that defect, the step breaks on
``OVERREACH_BREAK_RATE`` of the (example, defect) pairs, with no symptom to read. Such a rewrite fixes its own
failures (it wins on them) and breaks other examples: a net gain where its defect is frequent, a net loss where
it is rare, as an LM's rewrite that overfits its evidence is. Only a validation on other examples tells.

Rewording (``reword``): ``repeat`` (a step's output depends only on the value it carries and its
defects, so an unchanged step repeats its output exactly), ``intermediate`` (the text of every
step but the last varies with its whole prompt: instruction, inputs and hint, as an LM's wording
does, while the record key it carries stays) and ``all`` (the same, and a ``reasoning`` output,
when the program asks for one as ``dspy.ChainOfThought`` does, varies too, the last step's
included). The value the metric reads (the last step's ``answer``) is exact in every mode. The
wording is a function of the prompt, as a deterministic LM (or a cache) gives: the same prompt
gets the same text.

Realism (``realism``, :class:`benchmarks.synthetic.realism.Realism`, default: all off): a task LM that samples
(slips, lucky guesses, hints followed per call, fresh wording per call), a prompt LM that misses symptoms it is
shown or invents a wrong rule, rules that fade as an instruction grows, defects whose fix exposes a partner
defect on the next step. Off, the world is exactly as described above.

Latency: every call sleeps (task calls ``task_s``, prompt calls ``prompt_s``), so threads overlap
the way they do with a remote LM.
"""

from __future__ import annotations

import json
import random
import re
import threading
import time
import zlib
from collections import Counter

from benchmarks.synthetic.realism import (
    EXACT,
    FADE_FREE_WORDS,
    INTERACT_EXPOSE_RATE,
    WRONG_RULE_BREAK_RATE,
    Realism,
)
from dspy_agentgrad.testing import FakeCall

SCRAMBLE = 0x5A3C96F1
HINT_FIX_RATE = 0.8
OVERREACH_BREAK_RATE = 0.2
DEMO_FIX_RATE = 0.5
_TICKET = re.compile(r"ticket T([0-9a-f]+)")
LAST_FIELD = "answer"
_TASK_FIELD = re.compile(r"note\d+|answer")
_CANDIDATE = re.compile(r"\b(k[0-9a-f]{5})\b")
_KEY = re.compile(r"key=(k[0-9a-f]{5})")
_TARGET = re.compile(r"produce the fields? `(\w+)`")
_SYMPTOM = re.compile(r"SYM-(\w+?-[a-z])\b")
_WRONG_RULE = re.compile(r"(RULE-\w+-x\d)\b")
_EXPOSED = re.compile(r"form-(\w+?-[a-z])\b")
_INSTRUCTION_INPUTS = ("current_instruction", "basic_instruction")
REWORD_MODES = ("repeat", "intermediate", "all")
WRONG_RULE_TEXT = "refuse any record whose key was not repeated in the question twice."
#: First words a rewording prompt LM opens an instruction with (one word each, so its length, and fading, stay).
_OPENERS = (
    "Given",
    "From",
    "Using",
    "With",
    "Taking",
    "Reading",
    "Considering",
    "Examining",
    "Studying",
    "Receiving",
    "Handling",
    "Processing",
    "Inspecting",
    "Reviewing",
    "Consulting",
    "Checking",
)
_TONES = ("carefully", "plainly", "briefly", "formally", "simply", "directly", "calmly", "strictly")
_ACTS = ("noted", "checked", "confirmed", "recorded", "traced", "matched", "compared", "reviewed")
_OBJECTS = ("the case file", "the listing", "the question", "the candidates", "the entry", "the register")


def step_index(field: str) -> int:
    return int(field[len("note") :]) if field.startswith("note") else -1


def defect_name(field: str, letter: int) -> str:
    """The defect of the step producing ``field``: ``note1-a``, ``answer-b``."""
    return f"{field}-{'ab'[letter]}"


def stable_hash(text: str) -> int:
    return zlib.crc32(text.encode("utf-8"))


def fix_phrase(defect: str) -> str:
    return f"RULE-{defect}: check the record for this case before writing the output."


def symptom(defect: str) -> str:
    return f"SYM-{defect}"


def encode_ticket(case: int, defects: list[int], unfixable: bool) -> str:
    """Case number, defect bits (step k's defects are bits 2k and 2k+1) and the unfixable flag,
    scrambled so that no rule reads them by accident."""
    mask = sum(1 << i for i in defects) | (int(unfixable) << 30)
    return f"T{((mask << 12 | case) ^ SCRAMBLE):x}"


def decode_ticket(question: str) -> tuple[int, list[int], bool]:
    match = _TICKET.search(question)
    if not match:
        return -1, [], False
    value = int(match.group(1), 16) ^ SCRAMBLE
    mask, case = value >> 12, value & 0xFFF
    return case, [i for i in range(30) if mask >> i & 1], bool(mask >> 30 & 1)


class SyntheticWorld:
    """The rule behind the synthetic fake LM (``fake_lm(SyntheticWorld())``); thread-safe and stateless
    apart from call counts: everything about an example is in its question. task_s / prompt_s:
    seconds each task / prompt call sleeps."""

    def __init__(
        self,
        task_s: float = 0.03,
        prompt_s: float = 0.08,
        reword: str = "repeat",
        overreach: float = 0.0,
        hint_rate: float = HINT_FIX_RATE,
        realism: Realism = EXACT,
    ):
        if reword not in REWORD_MODES:
            raise ValueError(f"reword must be one of {REWORD_MODES}; got {reword!r}")
        for name, share in (("overreach", overreach), ("hint_rate", hint_rate)):
            if not 0.0 <= share <= 1.0:
                raise ValueError(f"{name} must be a share between 0 and 1; got {share!r}")
        self.task_s, self.prompt_s, self.reword, self.overreach = task_s, prompt_s, reword, overreach
        self.hint_rate, self.realism = hint_rate, realism
        self.calls: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._rng = random.Random(f"synthetic-lm-{realism.seed}")

    def _chance(self, key: str, rate: float, sampled: bool | None = None) -> bool:
        """True on a share ``rate`` of draws: a stable hash of ``key`` for a deterministic LM (the same prompt
        gets the same answer), a fresh draw per call where it samples (``sampled``, default: temperature > 0)."""
        if rate <= 0.0:
            return False
        if sampled if sampled is not None else self.realism.temperature > 0:
            with self._lock:
                return self._rng.random() < rate
        return stable_hash(key) % 100 < rate * 100

    def __call__(self, call: FakeCall):
        task = any(_TASK_FIELD.fullmatch(f) for f in call.output_fields)
        with self._lock:
            self.calls["task" if task else "prompt"] += 1
        delay = self.task_s if task else self.prompt_s
        if delay > 0:  # an instant LM must not even yield the CPU (sleep(0) does)
            time.sleep(delay)
        return self.task(call) if task else self.prompt(call)

    # -- task steps ------------------------------------------------------------------------------
    def task(self, call: FakeCall) -> dict:
        """The step's output; reworded per :attr:`reword` (never the value the next step or the metric reads)."""
        field = next(f for f in call.output_fields if _TASK_FIELD.fullmatch(f))
        out = self._value(call, field)
        if self.reword == "repeat":
            return out
        wording = self._wording(call, self._draw() if self.realism.temperature > 0 else 0)
        if field != LAST_FIELD:
            out[field] = f"{out[field]} [{wording}]"
        if self.reword == "all" and "reasoning" in call.output_fields:
            out["reasoning"] = f"I {wording} before writing `{field}`."
        return out

    def _draw(self) -> int:
        with self._lock:
            return self._rng.getrandbits(30)

    @staticmethod
    def _wording(call: FakeCall, sample: int = 0) -> str:
        """A phrase that changes with any change of the prompt (instruction, inputs, hint) and, where the LM
        samples, with every call (``sample``)."""
        h = stable_hash(json.dumps([call.instructions, sorted(call.inputs.items()), sample]))
        return (
            f"{_ACTS[h % len(_ACTS)]} {_OBJECTS[h // 8 % len(_OBJECTS)]} {_TONES[h // 64 % len(_TONES)]}, "
            f"pass {h // 512 % 1000}"
        )

    def _value(self, call: FakeCall, field: str) -> dict:
        upstream = sorted((k for k in call.inputs if _TASK_FIELD.fullmatch(k)), key=step_index)
        index = step_index(upstream[-1]) + 1 if upstream else 0
        question = call.inputs.get("question", "")
        case, bits, unfixable = decode_ticket(question)
        last = field == LAST_FIELD
        if index == 0:
            key = self._resolve(question, case)
        else:
            found = _KEY.search(call.inputs.get(upstream[-1], ""))
            key = found.group(1) if found else None
        if key is None:
            return {field: "unknown" if last else "key=? (no record key in the input)"}
        own = [defect_name(field, bit % 2) for bit in bits if bit // 2 == index]
        exposed = [d for d in self._exposed(call, upstream, field) if d not in own]
        broken = [d for d in own + exposed if not self._rule_works(call, d, case)]
        if broken and call.hint is not None and self._chance(f"{case}:{field}", self.hint_rate):
            broken = []
        if broken and stable_hash(f"demo:{case}:{field}") % 100 < DEMO_FIX_RATE * 100:
            shown = self._demonstrated(call.demos, field, index)
            broken = [d for d in broken if d not in shown]
        if broken and self._chance("", self.realism.lucky, sampled=True):
            broken = []  # a sampling LM sometimes gets a step right that its prompt does not teach
        if broken:
            shown = " ".join(symptom(d) for d in broken)
            return {field: f"unknown ({shown})" if last else f"key=? ({shown})"}
        if self._over_strict(call, field, case, own) or self._wrong_rule_breaks(call, case):
            return {field: "unknown" if last else "key=? (not confirmed)"}
        if self._chance("", self.realism.slip, sampled=True):  # a sampling LM slips on a step it knows
            return {field: "unknown" if last else "key=? (not confirmed)"}
        if last:
            return {field: "unknown" if unfixable else key}
        forms = "".join(f"; form-{d}" for d in own if self._partner(d) is not None and f"RULE-{d}" in call.instructions)
        return {field: f"key={key} (checked at step {index}{forms})"}

    def _rule_works(self, call: FakeCall, defect: str, case: int) -> bool:
        """Whether the instruction's fix phrase for ``defect`` repairs this call: it must be there, and where
        rules fade, a long instruction is followed less (per example, or per call where the LM samples)."""
        if f"RULE-{defect}" not in call.instructions:
            return False
        extra = len(call.instructions.split()) - FADE_FREE_WORDS
        if self.realism.fade <= 0 or extra <= 0:
            return True
        strength = 1.0 / (1.0 + self.realism.fade * extra / FADE_FREE_WORDS)
        return self._chance(f"fade:{case}:{defect}", strength)

    def _partner(self, defect: str) -> int | None:
        """Interacting defects: which of the next step's two defects (0 or 1) fixing ``defect`` exposes, or None."""
        if defect.startswith(LAST_FIELD) or stable_hash(f"interact:{defect}") % 100 >= self.realism.interact * 100:
            return None
        return stable_hash(f"partner:{defect}") % 2

    def _exposed(self, call: FakeCall, upstream: list[str], field: str) -> list[str]:
        """This step's defects that an upstream fix exposed on this example (marked in the upstream output):
        the fixed step now writes a form the next step mishandles on a share of the fixed examples."""
        if not upstream:
            return []
        case = decode_ticket(call.inputs.get("question", ""))[0]
        out = []
        for source in _EXPOSED.findall(call.inputs.get(upstream[-1], "")):
            letter = self._partner(source)
            hit = stable_hash(f"expose:{case}:{source}") % 100 < INTERACT_EXPOSE_RATE * 100
            if letter is not None and hit and defect_name(field, letter) not in out:
                out.append(defect_name(field, letter))
        return out

    def _wrong_rule_breaks(self, call: FakeCall, case: int) -> bool:
        """Whether a wrong rule (one a prompt LM invented) in the instruction breaks this example."""
        return any(
            stable_hash(f"wrong:{case}:{rule}") % 100 < WRONG_RULE_BREAK_RATE * 100
            for rule in _WRONG_RULE.findall(call.instructions)
        )

    def overreaches(self, defect: str) -> bool:
        """Whether ``defect``'s fix phrase also makes its step over-strict (see the module docstring)."""
        return stable_hash(f"overreach:{defect}") % 100 < self.overreach * 100

    def _over_strict(self, call: FakeCall, field: str, case: int, own: list[str]) -> bool:
        """Whether an overreaching fix phrase in the instruction breaks this step on this example (one it is
        not about)."""
        for defect in (defect_name(field, 0), defect_name(field, 1)):
            if defect in own or not self.overreaches(defect) or f"RULE-{defect}" not in call.instructions:
                continue
            if stable_hash(f"overreach:{case}:{defect}") % 100 < OVERREACH_BREAK_RATE * 100:
                return True
        return False

    @staticmethod
    def _demonstrated(demos: list[dict], field: str, index: int) -> set[str]:
        """The defects of step ``index`` carried by the cases of demonstrations that show a correct ``field``."""
        shown = set()
        for demo in demos:
            value = str(demo.get(field, ""))
            if not value or "SYM-" in value or value.startswith(("unknown", "key=?")):
                continue
            _, bits, _ = decode_ticket(str(demo.get("question", "")))
            shown |= {defect_name(field, bit % 2) for bit in bits if bit // 2 == index}
        return shown

    @staticmethod
    def _resolve(question: str, case: int) -> str | None:
        """The first step's lookup: which of the question's candidate keys belongs to this case."""
        keys = _CANDIDATE.findall(question)
        return keys[case * 7 % len(keys)] if keys and case >= 0 else None

    # -- prompt roles ----------------------------------------------------------------------------
    def prompt(self, call: FakeCall):
        current, evidence_text = self._split(call)
        target = _TARGET.search(current)
        seen = []
        if target:
            for defect in _SYMPTOM.findall(evidence_text):
                if defect.rsplit("-", 1)[0] == target.group(1) and defect not in seen:
                    seen.append(defect)
        seen = [d for d in seen if not self._chance("", 1.0 - self.realism.recall, sampled=True)]  # missed

        def written() -> str:  # only instruction-writing calls draw (wrong rules, rewording)
            return self._reworded(call, self._improved(current, seen))

        if "I provided an assistant with the following instructions" in call.user:
            return f"```\n{written()}\n```"
        outputs = call.output_fields
        if "clusters" in outputs:
            return {"clusters": self._clusters(call, target.group(1) if target else None)}
        advice = " ".join(f"The step showed {symptom(d)}; add the rule {fix_phrase(d)}" for d in seen)
        if "gradient" in outputs:
            return {"gradient": advice or "No change needed."}
        if "generalized_gradient" in outputs:
            return {"generalized_gradient": advice or "No change needed."}
        if "new_instruction" in outputs and "examples_with_feedback" in call.inputs:  # dspy.GEPA: JSON adapter
            return json.dumps({"new_instruction": written()})
        if "new_instruction" in outputs:
            return {"new_instruction": written()}
        if "proposed_instruction" in outputs:
            return {name: "A program step." for name in outputs} | {"proposed_instruction": written()}
        return {name: "A short description of a multi-step lookup program." for name in outputs}

    @staticmethod
    def _split(call: FakeCall) -> tuple[str, str]:
        """The instruction being improved, and the rest of the input (where evidence may be)."""
        for name in _INSTRUCTION_INPUTS:
            if name in call.inputs:
                rest = "\n".join(v for k, v in call.inputs.items() if k != name)
                return call.inputs[name], rest
        blocks = call.user.split("```")
        if len(blocks) > 2:
            return blocks[1].strip(), "```".join(blocks[2:])
        return "", call.user

    def _improved(self, current: str, defects: list[str]) -> str:
        """The instruction with the missing fix phrases; where the prompt LM invents rules, sometimes a wrong
        rule too (on the step the instruction is about, only when it changes something)."""
        missing = [fix_phrase(d) for d in defects if f"RULE-{d}" not in current]
        target = _TARGET.search(current)
        if missing and target and self._chance("", self.realism.wrong_rule, sampled=True):
            missing.append(f"RULE-{target.group(1)}-x{self._draw() % 10}: {WRONG_RULE_TEXT}")
        return " ".join([current.rstrip(), *missing]) if missing else current

    def _reworded(self, call: FakeCall, instruction: str) -> str:
        """``instruction`` with its first word changed on a share ``paraphrase`` of calls (the opener drawn from the
        prompt and a fresh draw, so it changes from call to call); its rules and its length stay."""
        if not instruction or not self._chance("", self.realism.paraphrase, sampled=True):
            return instruction
        h = stable_hash(json.dumps([call.user, sorted(call.inputs.items()), self._draw()]))
        first, _, rest = instruction.partition(" ")
        openers = [o for o in _OPENERS if o != first]
        opener = openers[h % len(openers)]
        return f"{opener} {rest}" if first in _OPENERS else f"{opener} {instruction}"

    def _clusters(self, call: FakeCall, target: str | None) -> list[dict]:
        """One cluster per distinct set of symptoms; when told a minimum size, small clusters are merged."""
        lines = re.findall(r"^\[(\d+)\] (.*)$", call.inputs.get("gradients", ""), flags=re.M)
        groups: dict[tuple[str, ...], list[int]] = {}
        for index, text in lines:
            own = tuple(sorted({d for d in _SYMPTOM.findall(text) if target and d.rsplit("-", 1)[0] == target}))
            groups.setdefault(own, []).append(int(index))
        minimum = int(call.inputs.get("min_cluster_size", "1") or 1)
        merged: list[tuple[list[str], list[int]]] = []
        small: tuple[list[str], list[int]] = ([], [])
        for defects, members in groups.items():
            if len(members) >= minimum:
                merged.append((list(defects), members))
            else:
                small[0].extend(d for d in defects if d not in small[0])
                small[1].extend(members)
        if small[1]:
            merged.append(small)
        return [
            {
                "members": members,
                "generalized_gradient": " ".join(
                    f"The step showed {symptom(d)}; add the rule {fix_phrase(d)}" for d in defects
                )
                or "No change needed.",
            }
            for defects, members in merged
        ]
