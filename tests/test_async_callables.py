"""``async def`` callables of the user's are awaited: an LLM-judge metric, ``hint_fn`` and
``instruction_proposer``, from the optimizer's worker threads, from async programs, and from a compile
called inside a running event loop; each gives the run the same decisions as its sync twin."""

from __future__ import annotations

import asyncio

import dspy
import pytest
from world import Pipeline, World, agentgrad, make_data, world_lm

from dspy_agentgrad import AgentGrad, default_hint
from dspy_agentgrad.config import AgentGradConfig
from dspy_agentgrad.testing import RuleEngine

TRAIN = make_data({"extract": 2, "notes": 2, "answer": 1})
VAL = make_data({"extract": 1, "notes": 1, "none": 1}, start=50)
FAST = dict(auto=None, max_rounds=2, progress=False)


class AsyncEngine(RuleEngine):
    async def complete(self, request):
        return RuleEngine.complete(self, request)


def judge_rule(call):
    return {"verdict": call.inputs["answer"] == call.inputs["expected"]}


JUDGE_LM = dspy.LM("fake/judge", engine=RuleEngine(judge_rule), async_engine=AsyncEngine(judge_rule), cache=False)
JUDGE = dspy.Predict("answer, expected -> verdict: bool")


def _verdict(gold, verdict: bool) -> dspy.Prediction:
    return dspy.Prediction(score=float(verdict), feedback="correct" if verdict else f"expected {gold.answer}")


def sync_judge(gold, pred, trace=None, pred_name=None, pred_trace=None):
    with dspy.context(lm=JUDGE_LM):
        return _verdict(gold, JUDGE(answer=str(getattr(pred, "answer", "")), expected=gold.answer).verdict)


async def async_judge(gold, pred, trace=None, pred_name=None, pred_trace=None):
    with dspy.context(lm=JUDGE_LM):
        judged = await JUDGE.acall(answer=str(getattr(pred, "answer", "")), expected=gold.answer)
    return _verdict(gold, judged.verdict)


def summary(result) -> dict:
    return {
        "instructions": result.final_instructions,
        "best": result.best_val_score,
        "candidates": [(c.predictor, c.accepted, c.reason) for c in result.candidates],
        "metric_calls": result.metric_calls,
        "task_usage": result.usage["task"],
        "errors": result.program_errors,
    }


def run(metric, program=None, **options):
    dspy.configure(lm=world_lm(World()))
    compiled = agentgrad(metric, **{**FAST, **options}).compile(program or Pipeline(), trainset=TRAIN, valset=VAL)
    return compiled.detailed_results


@pytest.mark.parametrize("threads", [1, 3])
def test_an_async_llm_judge_metric_decides_as_its_sync_twin(threads):
    sync, asynced = run(sync_judge, num_threads=threads), run(async_judge, num_threads=threads)
    assert not asynced.program_errors  # a coroutine left unawaited would be "metric returned a coroutine"
    assert asynced.best_val_score > asynced.initial_val_score
    assert summary(asynced) == summary(sync)  # the judge's own LM calls are counted alike


def test_async_hint_fn_and_instruction_proposer_are_awaited():
    seen = {"hint": 0, "rewrite": 0}

    def sync_hint(example, pred_name, prediction, feedback):
        return default_hint(example, pred_name, prediction, feedback)

    async def async_hint(example, pred_name, prediction, feedback):
        seen["hint"] += 1
        await asyncio.sleep(0)
        return sync_hint(example, pred_name, prediction, feedback)

    def sync_rewrite(request):
        return f"{request.current_instruction} {request.generalized_gradient}"

    async def async_rewrite(request):
        seen["rewrite"] += 1
        await asyncio.sleep(0)
        return sync_rewrite(request)

    sync = run(sync_judge, hint_fn=sync_hint, instruction_proposer=sync_rewrite)
    asynced = run(sync_judge, hint_fn=async_hint, instruction_proposer=async_rewrite)
    assert seen["hint"] > 0 and seen["rewrite"] > 0
    assert any(c.accepted for c in asynced.candidates)
    assert summary(asynced) == summary(sync)


class AsyncPipeline(Pipeline):
    forward = None

    async def aforward(self, question):
        from world import retrieve

        keyword = (await self.extract.acall(question=question)).keyword
        notes = (await self.notes.acall(question=question, passages=retrieve(keyword))).notes
        answer = (await self.answer.acall(question=question, notes=notes)).answer
        return dspy.Prediction(answer=answer, keyword=keyword)


def test_an_async_program_with_an_async_metric_compiled_inside_a_running_event_loop():
    world = World()
    lm = dspy.LM("fake/async-world", engine=RuleEngine(world), async_engine=AsyncEngine(world), cache=False)

    async def main():
        dspy.configure(lm=lm)
        optimizer = AgentGrad(async_judge, num_threads=2, config=AgentGradConfig.from_options(**FAST))
        return optimizer.compile(AsyncPipeline(), trainset=TRAIN, valset=VAL).detailed_results

    inside_loop = asyncio.run(main())
    reference = run(sync_judge, num_threads=2)
    assert not inside_loop.program_errors
    assert inside_loop.best_val_score == reference.best_val_score > inside_loop.initial_val_score
    assert inside_loop.final_instructions == reference.final_instructions
