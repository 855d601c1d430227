"""A small deterministic world for AgentGrad tests: a 3-predictor program and a rule-based LM.

Each question names an id and a *kind*: the predictor that goes wrong on it
(``either``: the note-taker goes wrong, and the question carries an alias that lets a
hinted answerer repair the run too; ``extract+notes``: two predictors go wrong, so no
single hint repairs it; ``boom``: the answerer's LM raises). A
predictor behaves on an example unless the example's kind is its own; it then
behaves if its instruction carries its fix token (``FIX-<name>``) or a hint.
Errors flow downstream (a wrong keyword retrieves nothing), so only the faulty predictor (or, for kind ``either``,
the answerer reading the question directly) can repair a run. The prompt-LM
roles answer with the fix token of the predictor they are asked about.
"""

from __future__ import annotations

import inspect
import json
import re
import zlib
from collections import Counter

import dspy

from dspy_agentgrad import AgentGrad
from dspy_agentgrad.config import AgentGradConfig
from dspy_agentgrad.testing import FakeCall, fake_lm

FIELD_TO_PREDICTOR = {"keyword": "extract", "notes": "notes", "answer": "answer"}
#: What a correct output of each predictor looks like (a demonstration showing one teaches the step).
GOOD_OUTPUT = {"extract": r"id\d+", "notes": r"the answer is ans-id\d+", "answer": r"ans-id\d+"}
PREDICTOR_FIELD = {name: field for field, name in FIELD_TO_PREDICTOR.items()}


class Pipeline(dspy.Module):
    """Attribute order (answer, extract, notes) differs from call order (extract, notes, answer)."""

    def __init__(self):
        super().__init__()
        self.answer = dspy.Predict("question, notes -> answer")
        self.extract = dspy.Predict("question -> keyword")
        self.notes = dspy.Predict("question, passages -> notes")

    def forward(self, question):
        keyword = self.extract(question=question).keyword
        notes = self.notes(question=question, passages=retrieve(keyword)).notes
        answer = self.answer(question=question, notes=notes).answer
        return dspy.Prediction(answer=answer, keyword=keyword)


def retrieve(keyword: str) -> str:
    """The world's search engine: a document holding the answer, for a well-formed id only."""
    return (
        f"document {keyword}: the answer is ans-{keyword}"
        if re.fullmatch(r"id\d+", keyword or "")
        else "no document found"
    )


def make_example(i: int, kind: str) -> dspy.Example:
    alias = f" alias=ans-id{i}" if kind == "either" else ""
    return dspy.Example(question=f"id{i} kind={kind}{alias}", answer=f"ans-id{i}").with_inputs("question")


def make_data(kinds: dict[str, int], start: int = 0) -> list[dspy.Example]:
    out, i = [], start
    for kind, count in kinds.items():
        for _ in range(count):
            out.append(make_example(i, kind))
            i += 1
    return out


def metric(example, pred, trace=None):
    return float(getattr(pred, "answer", None) == example.answer)


def feedback_metric(gold, pred, trace=None, pred_name=None, pred_trace=None):
    ok = getattr(pred, "answer", None) == gold.answer
    return dspy.Prediction(
        score=float(ok), feedback="correct" if ok else f"expected {gold.answer}, got {getattr(pred, 'answer', None)}"
    )


def counted(metric_fn):
    """``metric_fn`` wrapped to count its calls (the list it returns gets one entry per call)."""
    calls = []

    def wrapped(gold, pred, trace=None, pred_name=None, pred_trace=None):
        calls.append(1)
        return metric_fn(gold, pred, trace, pred_name, pred_trace)

    return wrapped, calls


def partial_metric(example, pred, trace=None):
    """Full credit for the answer, half credit for the right keyword alone."""
    if getattr(pred, "answer", None) == example.answer:
        return 1.0
    return 0.5 if getattr(pred, "keyword", None) == example.question.split()[0] else 0.0


def _first_output_field(call: FakeCall) -> str | None:
    """The first output field of the predictor an optimizer role is asked about (from its instruction)."""
    text = call.inputs.get("current_instruction", call.instructions)
    found = re.search(r"produce the fields `(\w+)`", text)
    return found.group(1) if found else None


class RoleWorld:
    """The optimizer's LM roles in a fake world: every gradient asks for the fix token of the
    predictor it is about (``FIX-<name>``), and a rewrite appends the token its feedback names."""

    def __init__(self, overfit: tuple[str, ...] = (), garbage_roles: bool = False):
        self.overfit = set(overfit)
        self.garbage_roles = garbage_roles
        self.calls: Counter[str] = Counter()

    def fix_name(self, call: FakeCall) -> str | None:
        """The name in the fix token of the predictor a role call is about."""
        return _first_output_field(call)

    def _role(self, call: FakeCall):
        name = self.fix_name(call)
        if "gradients" in call.inputs and "clusters" in call.output_fields:
            self.calls["abstract"] += 1
            if self.garbage_roles:
                return "garbage with no fields"
            texts = re.findall(r"^\[(\d+)\] (.*)$", call.inputs["gradients"], flags=re.M)
            groups: dict[str, list[int]] = {}
            for index, text in texts:
                groups.setdefault(text, []).append(int(index))
            return {"clusters": [{"members": m, "generalized_gradient": t} for t, m in groups.items()]}
        if "generalized_gradient" in call.output_fields:
            self.calls["summarize"] += 1
            return {"generalized_gradient": call.inputs["gradients"].splitlines()[0].split("] ", 1)[1]}
        if "gradient" in call.output_fields:
            self.calls["gradient"] += 1
            return {"gradient": f"Always apply FIX-{name}."}
        if "new_instruction" in call.output_fields:
            self.calls["rewrite"] += 1
            token = re.search(r"FIX-(\w+)", call.inputs["feedback"])
            extra = f" FIX-{token.group(1)}" if token else ""
            if token and token.group(1) in self.overfit:
                extra += " OVERFIT"
            return {"new_instruction": call.inputs["current_instruction"] + extra}
        raise AssertionError(f"unexpected call: {call.output_fields}")


class World(RoleWorld):
    """The rule behind the fake LM. Options change how the world misbehaves.

    overfit: predictor names whose rewrite also carries ``OVERFIT``, which fixes that
        predictor's own kind but breaks every other example (wins on its cluster,
        loses on validation).
    leaky_answer: the answerer copies the gold answer out of a hint.
    hint_follow_rate: the share of (example, predictor) pairs where a hinted faulty predictor
        follows its hint (chosen by a stable hash, so runs repeat); rewrites always work.
    learns_from: ``"instructions"`` (a faulty predictor is repaired by its fix token) or ``"demos"``
        (it ignores instructions and is repaired by a demonstration of a correct output of its own).
    """

    def __init__(
        self,
        overfit: tuple[str, ...] = (),
        leaky_answer: bool = False,
        garbage_roles: bool = False,
        hint_follow_rate: float = 1.0,
        learns_from: str = "instructions",
    ):
        super().__init__(overfit, garbage_roles)
        self.leaky_answer = leaky_answer
        self.hint_follow_rate = hint_follow_rate
        self.learns_from = learns_from

    def fix_name(self, call: FakeCall) -> str | None:
        return FIELD_TO_PREDICTOR.get(_first_output_field(call) or "")

    # -- task predictors -------------------------------------------------------------------------
    def _behaves(self, name: str, call: FakeCall, kind: str) -> bool:
        faulty = name in kind.split("+") or (kind == "either" and name == "notes")
        if "OVERFIT" in call.instructions and not faulty:
            return False
        return not faulty or self._taught(name, call) or (call.hint is not None and self._follows(name, call))

    def _taught(self, name: str, call: FakeCall) -> bool:
        if self.learns_from == "instructions":
            return f"FIX-{name}" in call.instructions
        shown = [demo.get(PREDICTOR_FIELD[name], "") for demo in call.demos]
        return any(re.fullmatch(GOOD_OUTPUT[name], value) for value in shown)

    def _follows(self, name: str, call: FakeCall) -> bool:
        return zlib.crc32(f"{name}:{call.inputs['question']}".encode()) % 1000 < self.hint_follow_rate * 1000

    def __call__(self, call: FakeCall):
        if "current_instruction" in call.inputs:
            return self._role(call)
        question = call.inputs["question"]
        qid, kind = re.match(r"(id\d+) kind=([\w+]+)", question).groups()
        if kind == "boom" and call.output_fields == ["answer"]:
            raise RuntimeError("the answer model crashed")
        if call.output_fields == ["keyword"]:
            self.calls["extract"] += 1
            return {"keyword": qid if self._behaves("extract", call, kind) else "bad"}
        if call.output_fields == ["notes"]:
            self.calls["notes"] += 1
            found = re.search(r"ans-id\d+", call.inputs["passages"])
            good = self._behaves("notes", call, kind) and found
            return {"notes": f"the answer is {found.group(0)}" if good else "no answer found"}
        self.calls["answer"] += 1
        hinted = call.hint is not None
        if hinted and self.leaky_answer:
            copied = re.search(r"answer = (\S+?)[;.\s]", call.hint)
            if copied:
                return {"answer": copied.group(1)}
        if kind == "either" and hinted:
            return {"answer": f"ans-{qid}"}
        found = re.search(r"ans-id\d+", call.inputs["notes"])
        good = self._behaves("answer", call, kind) and found
        return {"answer": found.group(0) if good else "ans-bad"}


def world_lm(world: World) -> dspy.LM:
    return fake_lm(world)


def instructions(program: dspy.Module) -> dict[str, str]:
    return {name: p.signature.instructions for name, p in program.named_predictors()}


def dumps(obj) -> str:
    return json.dumps(obj, sort_keys=True, default=str)


class ShapeWorld(RoleWorld):
    """A world for program-shape tests.

    ``answers`` maps each output field to a function of the call that gives its correct
    value. The predictor whose outputs include ``faulty`` answers ``wrong`` in that field
    on the calls where ``faulty_when(call)`` holds, unless its instruction carries its fix
    token (``FIX-`` and the first output field its instruction names) or the call carries
    a hint (``follows_hint(call)`` decides whether a hinted call follows it; always by default).
    """

    def __init__(self, answers, faulty, faulty_when=lambda call: True, wrong="wrong", follows_hint=None):
        super().__init__()
        self.answers, self.faulty, self.faulty_when, self.wrong = answers, faulty, faulty_when, wrong
        self.follows_hint = follows_hint or (lambda call: True)

    def __call__(self, call: FakeCall):
        if "current_instruction" in call.inputs:
            return self._role(call)
        self.calls[call.output_fields[-1]] += 1
        out = {field: self.answers[field](call) for field in call.output_fields}
        token = f"FIX-{_first_output_field(call)}"  # the token the roles write for this predictor
        repaired = token in call.instructions or (call.hint is not None and self.follows_hint(call))
        if self.faulty in out and self.faulty_when(call) and not repaired:
            out[self.faulty] = self.wrong
        return out


def agentgrad(metric, **options) -> AgentGrad:
    """``AgentGrad`` from options by their flat names: its own keywords as keywords, the others through config=."""
    own = set(inspect.signature(AgentGrad).parameters) - {"metric", "preset", "config"}
    config = AgentGradConfig.from_options(**{k: v for k, v in options.items() if k not in own})
    return AgentGrad(metric, **{k: v for k, v in options.items() if k in own}, config=config)
