"""Who is blamed, and with which call: a call that raised, a predictor called several times under an LM that
rewords, a predictor run in a thread the program starts itself."""

from __future__ import annotations

import contextvars
import re
import zlib
from concurrent.futures import ThreadPoolExecutor

import dspy
import pytest
from world import Pipeline, RoleWorld, World, agentgrad, feedback_metric, make_data

from dspy_agentgrad import AgentGrad
from dspy_agentgrad.config import AgentGradConfig
from dspy_agentgrad.program.interception import CallOutsideRun
from dspy_agentgrad.testing import FakeCall, RuleEngine, fake_lm

FAST = dict(auto=None, progress=False)


# ---- a call that raised is a step: its predictor can be hinted and blamed ------------------------------


class UnparsableAnswerWorld(World):
    """The world of tests/world.py, except that the answerer, where it goes wrong, replies with text that no
    adapter can parse (a parse failure: DSPy records nothing for a call that raised)."""

    def __call__(self, call: FakeCall):
        if "current_instruction" in call.inputs or call.output_fields != ["answer"]:
            return super().__call__(call)
        kind = re.search(r"kind=([\w+]+)", call.inputs["question"]).group(1)
        if self._behaves("answer", call, kind):
            return super().__call__(call)
        self.calls["garbage"] += 1
        return "I would rather not answer in the format you asked for."


def test_a_predictor_whose_call_failed_to_parse_is_blamed_not_left_as_a_hard_case():
    world = UnparsableAnswerWorld()
    dspy.configure(lm=fake_lm(world))
    train = make_data({"answer": 3, "extract": 1, "none": 1})
    report = AgentGrad(feedback_metric, config=AgentGradConfig.from_options(max_rounds=1, **FAST)).attribute(
        Pipeline(), train
    )
    assert world.calls["garbage"] > 0, "the answerer's replies did fail to parse"
    assert report.hard_cases == []
    assert report.counts() == {"extract": 1, "notes": 0, "answer": 3}
    record = report.attributed["answer"][0]
    assert "Parse" in record.original["error"] and re.fullmatch(r"ans-id\d+", record.corrected["answer"])


def test_a_program_whose_answerer_fails_to_parse_gets_its_instruction_rewritten():
    dspy.configure(lm=fake_lm(UnparsableAnswerWorld()))
    train = make_data({"answer": 3, "none": 1})
    val = make_data({"answer": 2, "none": 1}, start=50)
    result = (
        AgentGrad(feedback_metric, config=AgentGradConfig.from_options(max_rounds=2, cluster_schedule=(1,), **FAST))
        .compile(Pipeline(), trainset=train, valset=val)
        .detailed_results
    )
    assert result.initial_val_score == pytest.approx(1 / 3) and result.best_val_score == 1.0
    assert "FIX-answer" in result.final_instructions["answer"]


# ---- a predictor called several times: the pseudo-label is the call the hint fixed --------------------


class Stages(dspy.Module):
    """One predictor called ``calls`` times. ``chain``: each call reads the answer before it (a loop, an agent);
    otherwise each call reads its own part of the input (a map). The program output holds every answer."""

    def __init__(self, calls: int, chain: bool):
        super().__init__()
        self.calls, self.chain = calls, chain
        self.step = dspy.Predict("part, previous -> result")

    def forward(self, x):
        results, previous = [], "start"
        for k in range(self.calls):
            part = f"{x} stage{k}"
            result = self.step(part=part, previous=previous if self.chain else "start").result
            results.append(result.split(" ~")[0])  # the meaning, without the wording
            previous = result
        return dspy.Prediction(answer=" ".join(results))


def stage_answer(example_x: str, k: int) -> str:
    return f"{example_x}-s{k}"


class StageWorld(RoleWorld):
    """Each call answers ``<x>-s<k>``; the call of stage ``faulty`` answers ``wrong`` unless hinted (or taught by
    the fix token). ``reword``: every answer carries a tag from its whole prompt, as an API model words its answer
    anew whenever its prompt changes."""

    def __init__(self, faulty: int, reword: bool):
        super().__init__()
        self.faulty, self.reword = faulty, reword

    def __call__(self, call: FakeCall):
        if "current_instruction" in call.inputs:
            return self._role(call)
        x, k = re.fullmatch(r"(\S+) stage(\d+)", call.inputs["part"]).groups()
        repaired = call.hint is not None or "FIX-result" in call.instructions
        result = "wrong" if int(k) == self.faulty and not repaired else stage_answer(x, int(k))
        if self.reword:
            result += f" ~{zlib.crc32(f'{call.instructions}|{sorted(call.inputs.items())}'.encode()) % 997}"
        return {"result": result}


def stage_metric(gold, pred, trace=None, pred_name=None, pred_trace=None):
    return float(pred.answer == gold.answer)


def stage_data(calls: int) -> list[dspy.Example]:
    xs = ["ka", "kb"]
    return [dspy.Example(x=x, answer=" ".join(stage_answer(x, k) for k in range(calls))).with_inputs("x") for x in xs]


STAGE_WORLDS = [
    (calls, faulty, reword, chain, threads, reuse)
    for calls in (2, 3, 4)
    for faulty in range(calls)
    for reword in (False, True)
    for chain in (False, True)
    for threads, reuse in ((1, True), (4, True), (1, False))
]


@pytest.mark.parametrize("calls, faulty, reword, chain, threads, reuse", STAGE_WORLDS)
def test_the_pseudo_label_of_a_predictor_called_several_times_is_the_call_the_hint_fixed(
    calls, faulty, reword, chain, threads, reuse
):
    """Every small world: 2-4 calls, any of them at fault, answers reworded or not, calls chained or not."""
    dspy.configure(lm=fake_lm(StageWorld(faulty, reword)))
    train = stage_data(calls)
    optimizer = AgentGrad(
        stage_metric, num_threads=threads, config=AgentGradConfig.from_options(max_rounds=1, reuse_calls=reuse, **FAST)
    )
    report = optimizer.attribute(Stages(calls, chain), train)
    records = report.attributed["step"]
    assert len(records) == len(train) and report.hard_cases == []
    for record in records:
        x = record.example.x
        assert record.inputs["part"] == f"{x} stage{faulty}"
        assert record.original["result"].split(" ~")[0] == "wrong"
        assert record.corrected["result"].split(" ~")[0] == stage_answer(x, faulty)


def test_finding_the_call_costs_no_metric_call_under_an_lm_that_does_not_reword():
    """Under an LM that answers a prompt the same way however it is hinted, the first call tried is the one the
    hint changed, and its run's output equals the fixed run's: it takes that score without a metric call."""
    calls, train = 3, stage_data(3)
    counts = {}
    for reword in (False, True):
        for threads in (1, 4):
            metric_calls = []

            def metric(gold, pred, trace=None, pred_name=None, pred_trace=None, _calls=metric_calls):
                _calls.append(1)
                return stage_metric(gold, pred)

            dspy.configure(lm=fake_lm(StageWorld(1, reword)))
            optimizer = AgentGrad(
                metric, num_threads=threads, config=AgentGradConfig.from_options(max_rounds=1, **FAST)
            )
            report = optimizer.attribute(Stages(calls, chain=True), train)
            assert [r.inputs["part"] for r in report.attributed["step"]] == ["ka stage1", "kb stage1"]
            counts.setdefault(reword, set()).add(len(metric_calls))
    # per example: its run and the hinted run; then under rewording the tries that hint one call alone: the first
    # call the hint changed (stage 0: its wording) and the latest (stage 2) fail and are scored; stage 1's try
    # fixes the run with the fixed run's output and takes its score
    assert counts == {False: {4}, True: {4 + 2 * 2}}, "the same at 1 and 4 threads"


class TopicStages(dspy.Module):
    """A topic finder, then one predictor called three times on parts that name the topic it found."""

    def __init__(self, chain: bool):
        super().__init__()
        self.chain = chain
        self.first = dspy.Predict("x -> topic")
        self.step = dspy.Predict("part, previous -> result")

    def forward(self, x):
        topic = self.first(x=x).topic.split(" ~")[0]
        results, previous = [], "start"
        for k in range(3):
            result = self.step(part=f"{topic} stage{k}", previous=previous if self.chain else "start").result
            results.append(result.split(" ~")[0])
            previous = result
        return dspy.Prediction(answer=" ".join(results))


class TopicWorld(StageWorld):
    """The topic finder goes wrong on every example unless hinted; then the stage world, under rewording."""

    def __call__(self, call: FakeCall):
        if "current_instruction" in call.inputs or "part" in call.inputs:
            return super().__call__(call)
        topic = call.inputs["x"] if call.hint is not None or "FIX-topic" in call.instructions else "bad"
        return {"topic": f"{topic} ~{zlib.crc32(f'{call.instructions}|{sorted(call.inputs.items())}'.encode()) % 997}"}


@pytest.mark.parametrize("faulty", [1, 2])
@pytest.mark.parametrize("chain", [False, True])
def test_a_cumulative_fix_labels_the_call_of_a_predictor_called_several_times_that_the_hint_fixed(faulty, chain):
    """Neither hint alone fixes a failure here (the topic and one stage are both wrong): the cumulative pass
    explains it with both, and the stage predictor's label is the call at fault, not the first one reworded."""
    dspy.configure(lm=fake_lm(TopicWorld(faulty, reword=True)))
    train = stage_data(3)
    report = AgentGrad(stage_metric, config=AgentGradConfig.from_options(max_rounds=1, **FAST)).attribute(
        TopicStages(chain), train
    )
    assert report.explained_cumulative == len(train) and report.hard_cases == []
    assert [r.inputs["part"] for r in report.attributed["step"]] == [f"{ex.x} stage{faulty}" for ex in train]
    assert [r.corrected["topic"].split(" ~")[0] for r in report.attributed["first"]] == [ex.x for ex in train]


# ---- a predictor run in a thread the program starts itself ---------------------------------------------


class PooledTagger(dspy.Module):
    """Tags each word in a ThreadPoolExecutor of its own, then combines the tags."""

    def __init__(self, keep_context: bool):
        super().__init__()
        self.keep_context = keep_context
        self.tag = dspy.Predict("item -> tag")
        self.combine = dspy.Predict("tags -> answer")

    def forward(self, x):
        with ThreadPoolExecutor(max_workers=3) as pool:
            if self.keep_context:
                futures = [pool.submit(contextvars.copy_context().run, self.tag, item=i) for i in x.split()]
            else:
                futures = [pool.submit(self.tag, item=i) for i in x.split()]
            tags = [f.result().tag for f in futures]
        return self.combine(tags=" ".join(tags))


class TagWorld(RoleWorld):
    """Tags are upper-cased words; a word starting with ``q`` is tagged ``wrong`` unless hinted or taught."""

    def __call__(self, call: FakeCall):
        if "current_instruction" in call.inputs:
            return self._role(call)
        if call.output_fields == ["tag"]:
            item = call.inputs["item"]
            repaired = call.hint is not None or "FIX-tag" in call.instructions
            return {"tag": "wrong" if item.startswith("q") and not repaired else item.upper()}
        return {"answer": call.inputs["tags"].replace(" ", "+")}


def tag_data(values: list[str]) -> list[dspy.Example]:
    return [dspy.Example(x=v, answer="+".join(w.upper() for w in v.split())).with_inputs("x") for v in values]


def exact_answer(gold, pred, trace=None):
    return float(pred.answer == gold.answer)


def pooled_run(keep_context: bool, max_task_calls: int) -> tuple[RuleEngine, AgentGrad]:
    """The task LM (counted: its engine) and the optimizer; the prompt LM is the configured one."""
    engine = RuleEngine(TagWorld())
    dspy.configure(lm=fake_lm(TagWorld()))
    task = dspy.LM("fake/tagger", engine=engine, cache=False)
    options = dict(max_rounds=2, max_task_calls=max_task_calls, cluster_schedule=(1,), task_model=task, **FAST)
    return engine, agentgrad(exact_answer, **options)


TAG_TRAIN, TAG_VAL = tag_data(["a qb c", "qd e", "f g"]), tag_data(["qi j", "k l"])


def test_a_predictor_run_in_the_programs_own_thread_pool_stops_the_run_with_its_name_and_no_lm_call():
    engine, optimizer = pooled_run(keep_context=False, max_task_calls=12)
    with pytest.raises(CallOutsideRun, match=r"predictor 'tag' was called in a thread the program started"):
        optimizer.compile(PooledTagger(keep_context=False), trainset=TAG_TRAIN, valset=TAG_VAL)
    assert engine.calls == 0, "the refused calls reached no LM, and the run stopped at the first run"


def test_a_thread_pool_that_carries_the_context_is_optimized_within_its_caps():
    engine, optimizer = pooled_run(keep_context=True, max_task_calls=60)
    program = PooledTagger(keep_context=True)
    result = optimizer.compile(program, trainset=TAG_TRAIN, valset=TAG_VAL).detailed_results
    assert result.best_val_score == 1.0 and "FIX-tag" in result.final_instructions["tag"]
    assert engine.calls == result.usage["task"]["calls"] <= 60


def test_a_binding_task_call_cap_holds_for_calls_made_in_the_programs_own_threads():
    engine, optimizer = pooled_run(keep_context=True, max_task_calls=20)
    result = optimizer.compile(PooledTagger(keep_context=True), trainset=TAG_TRAIN, valset=TAG_VAL).detailed_results
    assert "task-LM budget" in result.stop_reason
    assert engine.calls <= 20
