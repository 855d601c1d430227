"""AgentGrad on ordinary DSPy program shapes: in each, one predictor is at fault; attribution must blame
it and compile must raise validation to the maximum (deterministic fake LMs, tests/world.py ShapeWorld)."""

from __future__ import annotations

import json
import re

import dspy
import pydantic
import pytest
from world import ShapeWorld, agentgrad

from dspy_agentgrad import AgentGrad, default_hint
from dspy_agentgrad.program.interception import rebuild_prediction
from dspy_agentgrad.program.runner import ProgramBug
from dspy_agentgrad.program.runs import Step
from dspy_agentgrad.testing import RuleEngine, fake_lm

FAST = dict(progress=False)


def optimizer(metric, **kwargs) -> AgentGrad:
    return agentgrad(metric, **{"auto": None, "max_rounds": 3, "cluster_schedule": (1,), **FAST, **kwargs})


def exact(field: str):
    def metric(example, pred, trace=None):
        return float(getattr(pred, field, None) == example[field])

    return metric


def data(values: list[str], answer, **extra) -> list[dspy.Example]:
    return [dspy.Example(x=v, answer=answer(v), **extra).with_inputs("x") for v in values]


def check(program, world, metric, train, val, blamed: str, lm=None):
    """Attribution blames ``blamed`` for every failure; compile raises validation from below 1 to 1."""
    dspy.configure(lm=lm or fake_lm(world))
    report = optimizer(metric).attribute(program, train)
    failures = sum(report.counts().values()) + len(report.hard_cases)
    assert failures > 0 and report.counts()[blamed] == failures, report.counts()
    result = optimizer(metric).compile(program, trainset=train, valset=val).detailed_results
    assert result.initial_val_score < 1.0 and result.best_val_score == 1.0
    assert "FIX-" in result.final_instructions[blamed]
    return report, result


# ---- dspy.Parallel and module.batch inside forward ------------------------------------------------


class Tagger(dspy.Module):
    def __init__(self, use_batch: bool):
        super().__init__()
        self.use_batch = use_batch
        self.tag = dspy.Predict("item -> tag")
        self.combine = dspy.Predict("tags -> answer")

    def forward(self, x):
        items = [dspy.Example(item=i).with_inputs("item") for i in x.split()]
        if self.use_batch:
            tags = self.tag.batch(items, num_threads=3, disable_progress_bar=True)
        else:
            tags = dspy.Parallel(num_threads=3, disable_progress_bar=True)([(self.tag, e) for e in items])
        return self.combine(tags=" ".join(t.tag for t in tags))


def tagger_world():
    return ShapeWorld(
        {"tag": lambda c: c.inputs["item"].upper(), "answer": lambda c: c.inputs["tags"].replace(" ", "+")},
        faulty="tag",
        faulty_when=lambda c: c.inputs["item"].startswith("q"),
    )


@pytest.mark.parametrize("use_batch", [False, True])
def test_predictor_inside_parallel_or_batch_is_blamed_and_fixed(use_batch):
    answer = lambda v: "+".join(w.upper() for w in v.split())  # noqa: E731
    train = data(["a qb c", "qd e", "f g", "qh"], answer)
    val = data(["qi j", "k l", "qm"], answer)
    report, _ = check(Tagger(use_batch), tagger_world(), exact("answer"), train, val, "tag")
    record = report.attributed["tag"][0]
    assert record.original == {"tag": "wrong"} and record.corrected["tag"].startswith("Q")
    engine = RuleEngine(tagger_world())  # LM calls in DSPy's worker threads are counted
    result = optimizer(exact("answer"), task_model=fake_lm(engine)).compile(
        Tagger(use_batch), trainset=train, valset=val
    )
    assert result.detailed_results.usage["task"]["calls"] == engine.calls


# ---- typed upstream outputs ------------------------------------------------------------------------


class Info(pydantic.BaseModel):
    name: str
    size: int


class TypedPipeline(dspy.Module):
    def __init__(self):
        super().__init__()
        self.parse = dspy.Predict("x -> info: Info, count: int, parts: list[str], mood: Literal['up', 'down']")
        self.answer = dspy.Predict("summary -> answer")

    def forward(self, x):
        got = self.parse(x=x)
        # attribute access and arithmetic: replaying a dict or a string here would crash
        summary = f"{got.info.name}:{got.info.size + got.count}:{'/'.join(got.parts)}:{got.mood}"
        return self.answer(summary=summary)


def typed_world():
    return ShapeWorld(
        {
            "info": lambda c: {"name": c.inputs["x"], "size": 1},
            "count": lambda c: 2,
            "parts": lambda c: ["p", "q"],
            "mood": lambda c: "up",
            "answer": lambda c: c.inputs["summary"],
        },
        faulty="answer",
        faulty_when=lambda c: "bad" in c.inputs["summary"],
    )


def test_typed_upstream_outputs_are_replayed_with_their_types():
    answer = lambda v: f"{v}:3:p/q:up"  # noqa: E731
    train = data(["bad1", "bad2", "ok3"], answer)
    val = data(["bad4", "ok5"], answer)
    world = typed_world()
    report, _ = check(TypedPipeline(), world, exact("answer"), train, val, "answer")
    assert report.replay_misses == 0
    # after a resume only JSON is left: the outputs are rebuilt from the signature's types
    parse = TypedPipeline().parse
    step = Step("parse", {"x": "a"}, {"info": {"name": "a", "size": 1}, "count": 2, "parts": ["p"], "mood": "up"})
    rebuilt = rebuild_prediction(parse.signature, step.outputs)
    assert isinstance(rebuilt.info, Info) and rebuilt.count == 2 and rebuilt.parts == ["p"]


# ---- ReAct with two tools, fault in a later call of the agent ------------------------------------


def lookup(q: str) -> str:
    """Look up a code."""
    return f"code-{q}"


def convert(value: str) -> str:
    """Convert a code to its final form."""
    return value.upper()


def _react_step(call):
    seen = [k for k in call.inputs if k.startswith("observation_")]
    question = call.inputs["question"]
    if len(seen) == 0:
        return "lookup", {"q": question}
    if len(seen) == 1:
        return "convert", {"value": call.inputs["observation_0"]}
    return "finish", {}


def react_world():
    def tool_args(call):
        name, args = _react_step(call)
        return args

    return ShapeWorld(
        {
            "next_thought": lambda c: "thinking",
            "next_tool_name": lambda c: _react_step(c)[0],
            "next_tool_args": tool_args,
            "reasoning": lambda c: "done",
            "answer": lambda c: c.inputs.get("observation_1", "none"),
        },
        faulty="next_tool_args",
        # the second call (convert) goes wrong for questions marked "hard"
        faulty_when=lambda c: "hard" in c.inputs["question"] and len([k for k in c.inputs if "observation_" in k]) == 1,
        wrong={"value": "nonsense"},
    )


def test_react_fault_in_a_later_call_is_blamed_on_the_agent_with_that_call_as_pseudo_label():
    program = dspy.ReAct("question -> answer", tools=[lookup, convert], max_iters=4)
    make = lambda qs: [dspy.Example(question=q, answer=f"CODE-{q}".upper()).with_inputs("question") for q in qs]  # noqa: E731
    train, val = make(["hard1", "hard2", "easy3"]), make(["hard4", "easy5"])
    report, _ = check(program, react_world(), exact("answer"), train, val, "react")
    record = report.attributed["react"][0]
    assert record.original["next_tool_args"] == {"value": "nonsense"}
    assert record.corrected["next_tool_args"] == {"value": "code-hard1"}


# ---- a loop whose fault is after the first call -------------------------------------------------


class Loop(dspy.Module):
    def __init__(self):
        super().__init__()
        self.read = dspy.Predict("passage -> fact")
        self.answer = dspy.Predict("facts -> answer")

    def forward(self, x):
        facts = [self.read(passage=p).fact for p in x.split()]
        return self.answer(facts=" ".join(facts))


def test_loop_fault_after_the_first_call():
    world = ShapeWorld(
        {"fact": lambda c: c.inputs["passage"][::-1], "answer": lambda c: c.inputs["facts"]},
        faulty="fact",
        faulty_when=lambda c: c.inputs["passage"].startswith("z"),
    )
    answer = lambda v: " ".join(p[::-1] for p in v.split())  # noqa: E731
    train, val = data(["ab cd zq", "ef zr", "gh ij"], answer), data(["kl zs", "mn"], answer)
    report, _ = check(Loop(), world, exact("answer"), train, val, "read")
    record = report.attributed["read"][0]
    assert record.inputs == {"passage": "zq"} and record.corrected == {"fact": "qz"}


# ---- a branch the first example skips ------------------------------------------------------------


class Branch(dspy.Module):
    def __init__(self):
        super().__init__()
        self.answer = dspy.Predict("x, expanded -> answer")
        self.expand = dspy.Predict("x -> expanded")

    def forward(self, x):
        expanded = self.expand(x=x).expanded if x.startswith("long") else x
        return self.answer(x=x, expanded=expanded)


def branch_world():
    return ShapeWorld(
        {
            "expanded": lambda c: c.inputs["x"] + "-full",
            # the answerer copies the expansion; with a hint it can also repair it itself
            "answer": lambda c: c.inputs["expanded"] if c.hint is None else c.inputs["x"] + "-full",
        },
        faulty="expanded",
    )


def test_branch_skipped_by_the_first_example_keeps_the_execution_order():
    answer = lambda v: v + "-full" if v.startswith("long") else v  # noqa: E731
    train = data(["short1", "long2", "long3"], answer)
    dspy.configure(lm=fake_lm(branch_world()))
    report = optimizer(exact("answer")).attribute(Branch(), train)
    assert report.order == ["expand", "answer"]
    # fixable at both predictors: the later one takes it (the paper's rule), whatever the first example ran
    assert report.counts() == {"expand": 0, "answer": 2}


def test_branch_predictor_is_blamed_when_only_it_can_fix():
    answer = lambda v: v + "-full" if v.startswith("long") else v  # noqa: E731
    world = branch_world()
    world.answers["answer"] = lambda c: c.inputs["expanded"]
    check(
        Branch(), world, exact("answer"), data(["short1", "long2", "long3"], answer), data(["long4"], answer), "expand"
    )


# ---- a single-predictor classifier --------------------------------------------------------------


def test_single_predictor_classifier_is_blamed_although_its_label_is_never_in_its_inputs():
    def sentiment(text):
        return "positive" if "good" in text and "not" not in text else "negative"

    world = ShapeWorld(
        {"label": lambda c: sentiment(c.inputs["text"])},
        faulty="label",
        faulty_when=lambda c: "not" in c.inputs["text"],
        wrong="positive",
    )
    make = lambda ts: [  # noqa: E731
        dspy.Example(text=t, label=sentiment(t)).with_inputs("text") for t in ts
    ]
    train = make(["good day", "not good at all", "not great", "bad"])
    val = make(["not good", "good", "bad"])
    report, _ = check(dspy.Predict("text -> label"), world, exact("label"), train, val, "self")
    assert report.leaked == 2  # the fixes copy the revealed label: kept as the fallback, no earlier predictor


# ---- nested modules, Refine / BestOfN, few-shot demos --------------------------------------------


class Inner(dspy.Module):
    def __init__(self):
        super().__init__()
        self.first = dspy.Predict("x -> draft")
        self.second = dspy.ChainOfThought("draft -> polished")

    def forward(self, x):
        return self.second(draft=self.first(x=x).draft)


class Outer(dspy.Module):
    def __init__(self):
        super().__init__()
        self.inner = Inner()
        self.final = dspy.Predict("polished -> answer")

    def forward(self, x):
        return self.final(polished=self.inner(x=x).polished)


def nested_world(**kwargs):
    return ShapeWorld(
        {
            "draft": lambda c: c.inputs["x"] + "-d",
            "reasoning": lambda c: "because",
            "polished": lambda c: c.inputs["draft"] + "-p",
            "answer": lambda c: c.inputs["polished"],
            "discussion": lambda c: "",
            "advice": lambda c: {},
        },
        faulty="polished",
        faulty_when=lambda c: "x" in c.inputs["draft"],
        **kwargs,
    )


def test_nested_modules():
    answer = lambda v: v + "-d-p"  # noqa: E731
    train, val = data(["x1", "x2", "y3"], answer), data(["x4", "y5"], answer)
    check(Outer(), nested_world(), exact("answer"), train, val, "inner.second.predict")


class Attempts(dspy.Module):
    def __init__(self, kind: str):
        super().__init__()
        reward = lambda args, pred: float(pred.polished.endswith("-p"))  # noqa: E731
        cls = dspy.Refine if kind == "refine" else dspy.BestOfN
        self.best = cls(module=Inner(), N=2, reward_fn=reward, threshold=1.0)

    def forward(self, x):
        return dspy.Prediction(answer=self.best(x=x).polished)


class TemperatureEngine(RuleEngine):
    """Records the temperature each predictor's LM requests were sent with."""

    def __init__(self, rule):
        super().__init__(lambda call: self.fields.append(call.output_fields[-1]) or rule(call))
        self.sent, self.fields = [], []

    def complete(self, request):
        self.sent.append(request.config.temperature)
        return super().complete(request)

    def temperatures(self, field: str) -> set:
        return {t for t, f in zip(self.sent, self.fields) if f == field}


@pytest.mark.parametrize("kind", ["refine", "best_of_n"])
def test_refine_and_best_of_n_attempts_get_the_hint_and_keep_their_lm_settings(kind):
    answer = lambda v: v + "-d-p"  # noqa: E731
    train, val = data(["x1", "x2", "y3"], answer), data(["x4", "y5"], answer)
    engine = TemperatureEngine(nested_world())
    dspy.configure(lm=fake_lm(nested_world()))
    report = optimizer(exact("answer"), task_model=fake_lm(engine)).attribute(Attempts(kind), train)
    assert report.counts()["best.module.second.predict"] == 2
    assert engine.temperatures("polished") == {1.0}  # each attempt's own LM copy (temperature=1.0)
    check(Attempts(kind), nested_world(), exact("answer"), train, val, "best.module.second.predict")


def test_hint_reaches_a_refine_retry_next_to_refines_own_advice():
    answer = lambda v: v + "-d-p"  # noqa: E731
    train, val = data(["x1", "x2", "y3"], answer), data(["x4", "y5"], answer)
    # the faulty predictor is repaired only by our hint on a retry that also carries Refine's advice
    world = nested_world(follows_hint=lambda call: "hint_" in call.inputs)
    world.answers["advice"] = lambda c: {"second.predict": "polish the draft properly"}
    check(Attempts("refine"), world, exact("answer"), train, val, "best.module.second.predict")


def test_few_shot_demos_are_kept():
    program = Outer()
    demo = dspy.Example(polished="demo-in", answer="demo-out")
    program.final.demos = [demo]
    answer = lambda v: v + "-d-p"  # noqa: E731
    train, val = data(["x1", "x2", "y3"], answer), data(["x4", "y5"], answer)
    dspy.configure(lm=fake_lm(nested_world()))
    compiled = optimizer(exact("answer")).compile(program, trainset=train, valset=val)
    assert compiled.detailed_results.best_val_score == 1.0
    assert [d.toDict() for d in compiled.final.demos] == [demo.toDict()]


# ---- async programs ----------------------------------------------------------------------------


class AsyncOuter(Outer):
    forward = None

    async def aforward(self, x):
        inner = await self.inner.second.acall(draft=(await self.inner.first.acall(x=x)).draft)
        return await self.final.acall(polished=inner.polished)


class AsyncRuleEngine(RuleEngine):
    async def complete(self, request):
        return RuleEngine.complete(self, request)


def test_async_program_runs_through_acall():
    answer = lambda v: v + "-d-p"  # noqa: E731
    train, val = data(["x1", "x2", "y3"], answer), data(["x4", "y5"], answer)
    world = nested_world()
    lm = dspy.LM("fake/async", engine=RuleEngine(world), async_engine=AsyncRuleEngine(world), cache=False)
    check(AsyncOuter(), world, exact("answer"), train, val, "inner.second.predict", lm=lm)


# ---- metrics ------------------------------------------------------------------------------------


def _metric_shapes():
    def two_args(example, pred):
        return float(pred.answer == example.answer)

    def with_kwargs(gold, pred, trace=None, **kwargs):
        assert set(kwargs) == {"pred_name", "pred_trace"}
        return float(pred.answer == gold.answer)

    return {"two_args": two_args, "kwargs": with_kwargs}


@pytest.mark.parametrize("shape", ["two_args", "kwargs"])
def test_metrics_with_two_arguments_or_kwargs(shape):
    answer = lambda v: v + "-d-p"  # noqa: E731
    train, val = data(["x1", "x2", "y3"], answer), data(["x4", "y5"], answer)
    check(Outer(), nested_world(), _metric_shapes()[shape], train, val, "inner.second.predict")


def test_metric_that_raises_scores_failure_and_is_counted(caplog):
    def flaky(example, pred, trace=None):
        if example.x == "y9":
            raise KeyError("no gold for y9")
        return float(pred.answer == example.answer)

    answer = lambda v: v + "-d-p"  # noqa: E731
    train, val = data(["x1", "x2", "y3"], answer), data(["x4", "y5", "y9"], answer)
    dspy.configure(lm=fake_lm(nested_world()))
    result = optimizer(flaky).compile(Outer(), trainset=train, valset=val).detailed_results
    assert result.program_errors["metric"] >= 1 and result.program_errors["metric:KeyError"] >= 1
    assert result.initial_val_score == pytest.approx(1 / 3) and result.best_val_score == pytest.approx(2 / 3)
    assert sum("Traceback" in r.getMessage() for r in caplog.records) == 1


def test_transient_metric_error_is_retried():
    raised = set()

    def judge(example, pred, trace=None):
        if example.x not in raised:
            raised.add(example.x)
            raise TimeoutError("judge timed out")
        return float(pred.answer == example.answer)

    answer = lambda v: v + "-d-p"  # noqa: E731
    dspy.configure(lm=fake_lm(nested_world()))
    result = optimizer(judge).compile(Outer(), trainset=data(["x1", "y3"], answer), valset=data(["y5"], answer))
    assert result.detailed_results.initial_val_score == 1.0


# ---- a forward with a bug -----------------------------------------------------------------------


class Buggy(Outer):
    def forward(self, x):
        return self.final(polished=self.inner(x=x).polished_text)  # no such field


def test_a_program_whose_forward_has_a_bug_stops_with_that_error():
    dspy.configure(lm=fake_lm(nested_world()))
    answer = lambda v: v  # noqa: E731
    with pytest.raises(ProgramBug, match="AttributeError"):
        optimizer(exact("answer")).compile(Buggy(), trainset=data(["x1", "x2"], answer), valset=data(["x3"], answer))
    with pytest.raises(ProgramBug, match="TypeError"):
        wrong_inputs = [dspy.Example(query="x1", answer="a").with_inputs("query")]
        optimizer(exact("answer")).compile(Outer(), trainset=wrong_inputs * 2, valset=wrong_inputs)


# ---- HotpotQA-shaped: metadata and reasoning ------------------------------------------------------


class MultiHop(dspy.Module):
    def __init__(self):
        super().__init__()
        self.query = dspy.ChainOfThought("question -> search_query")
        self.answer = dspy.ChainOfThought("question, passages -> answer")

    def forward(self, question):
        passages = f"doc about {self.query(question=question).search_query}: its capital is cap-{question[-1]}"
        return self.answer(question=question, passages=passages)


def test_hotpotqa_shape_metadata_and_reasoning_do_not_trip_the_leak_guard():
    def query_of(c):
        return c.inputs["question"].split()[-1]

    world = ShapeWorld(
        {
            # the reasoning mentions metadata words (the bridge question type, its hard level)
            "reasoning": lambda c: "this is a hard bridge question",
            "search_query": query_of,
            "answer": lambda c: (
                re.search(r"cap-\w", c.inputs["passages"]).group(0)
                if f"about {query_of(c)}:" in c.inputs["passages"]
                else "unknown"
            ),
        },
        faulty="search_query",
        faulty_when=lambda c: "where" in c.inputs["question"],
    )
    make = lambda qs: [  # noqa: E731
        dspy.Example(
            question=q, answer=f"cap-{q[-1]}", id=f"id-{q}", type="bridge", level="hard", supporting_facts=["x"]
        ).with_inputs("question")
        for q in qs
    ]
    train, val = make(["where is a", "where is b", "what is c"]), make(["where is d", "what is e"])
    report, _ = check(MultiHop(), world, exact("answer"), train, val, "query.predict")
    assert report.leaked == 0
    hint = default_hint(train[0], "query.predict", dspy.Prediction(reasoning="r", answer="x"), "")
    assert "cap-a" in hint.text and not any(word in hint.text for word in ("bridge", "hard", "id-"))
    assert json.dumps(hint.reveals) == '["cap-a"]'


def test_an_llm_judge_metrics_own_lm_calls_are_counted():
    judge_engine = RuleEngine(lambda call: {"verdict": "yes" if call.inputs["answer"].endswith("-p") else "no"})
    judge = dspy.Predict("answer -> verdict")
    judge.set_lm(fake_lm(judge_engine))

    def judged(example, pred, trace=None):
        return float(judge(answer=pred.answer).verdict == "yes")

    task_engine = RuleEngine(nested_world())
    dspy.configure(lm=fake_lm(nested_world()))
    answer = lambda v: v + "-d-p"  # noqa: E731
    result = (
        optimizer(judged, task_model=fake_lm(task_engine))
        .compile(Outer(), trainset=data(["x1", "y3"], answer), valset=data(["x5", "y6"], answer))
        .detailed_results
    )
    assert judge_engine.calls > 0
    assert result.usage["task"]["calls"] == task_engine.calls + judge_engine.calls


def test_replay_after_a_resume_rebuilds_typed_outputs_or_runs_the_call_live():
    from dspy_agentgrad.program.metric import Metric
    from dspy_agentgrad.program.runner import ProgramRunner
    from dspy_agentgrad.program.runs import Outcome

    world = typed_world()
    dspy.configure(lm=fake_lm(world))
    runner = ProgramRunner(TypedPipeline(), Metric(exact("answer")))
    example = data(["bad1"], lambda v: f"{v}:3:p/q:up")[0]
    instructions = {name: p.signature.instructions for name, p in runner.program.named_predictors()}
    first = runner.run(example, instructions)
    journaled = Outcome.from_dict(json.loads(json.dumps(first.to_dict())))  # what a resumed run has
    upstream = [s for s in journaled.steps if s.name == "parse"]
    parse_calls = world.calls["mood"]
    fixed = runner.run(example, instructions, hints={"answer": "be right"}, replay=upstream)
    assert (first.score, fixed.score, fixed.replay_misses) == (0.0, 1.0, 0)
    assert world.calls["mood"] == parse_calls  # replayed, not run
    upstream[0].outputs["count"] = "not a number"  # cannot be rebuilt as an int: the call runs live
    live = runner.run(example, instructions, hints={"answer": "be right"}, replay=upstream)
    assert (live.score, live.replay_misses, world.calls["mood"]) == (1.0, 1, parse_calls + 1)


def test_parallel_program_attribution_is_the_same_with_optimizer_threads():
    answer = lambda v: "+".join(w.upper() for w in v.split())  # noqa: E731
    train = data(["a qb c", "qd e", "f g", "qh", "qi qj"], answer)
    dspy.configure(lm=fake_lm(tagger_world()))
    reports = [optimizer(exact("answer"), num_threads=n).attribute(Tagger(False), train) for n in (1, 4)]
    assert [json.dumps(r.to_dict(), sort_keys=True) for r in reports][0] == json.dumps(
        reports[1].to_dict(), sort_keys=True
    )
