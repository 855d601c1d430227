"""An instruction that starts longer than max_instruction_chars (a ReAct agent's tool list) can be rewritten."""

from __future__ import annotations

import dspy
from world import Pipeline, World, feedback_metric, make_data, world_lm

from dspy_agentgrad import AgentGrad
from dspy_agentgrad.config import AgentGradConfig
from dspy_agentgrad.testing import FakeCall

FAST = dict(auto=None, progress=False)
TRAIN = make_data({"answer": 2, "none": 1})
VAL = make_data({"answer": 2, "none": 1}, start=50)
TOOLS = " ".join(f"tool_{i}(query: str, limit: int = 10) -> list[str]: searches source {i}." for i in range(80))


def long_answerer() -> Pipeline:
    """The pipeline of tests/world.py whose answerer's instruction lists 80 tools (about 5,400 characters)."""
    program = Pipeline()
    signature = program.answer.signature
    program.answer.signature = signature.with_instructions(f"{signature.instructions} Tools: {TOOLS}")
    return program


class VerboseRewrites(World):
    """The world of tests/world.py whose rewrite role also appends ``extra`` characters of elaboration."""

    def __init__(self, extra: int):
        super().__init__()
        self.extra = extra

    def _role(self, call: FakeCall):
        out = super()._role(call)
        if "new_instruction" in call.output_fields:
            self.calls["cap shown"] = int(call.inputs["max_instruction_chars"])
            return {"new_instruction": out["new_instruction"] + " " + "z" * self.extra}
        return out


def compile_with(world: World):
    dspy.configure(lm=world_lm(world))
    optimizer = AgentGrad(
        feedback_metric,
        config=AgentGradConfig.from_options(max_rounds=2, cluster_schedule=(1,), max_instruction_chars=4000, **FAST),
    )
    return optimizer.compile(long_answerer(), trainset=TRAIN, valset=VAL).detailed_results


def test_an_instruction_already_over_the_cap_is_rewritten():
    start = len(long_answerer().answer.signature.instructions)
    assert start > 4000
    world = VerboseRewrites(extra=200)
    result = compile_with(world)
    assert world.calls["cap shown"] == start + 1000, "the rewrite prompt states the cap that applies"
    assert result.best_val_score == 1.0 and "FIX-answer" in result.final_instructions["answer"]
    assert [c.accepted for c in result.candidates if c.predictor == "answer"] == [True]


def test_a_rewrite_past_the_raised_cap_is_rejected_saying_the_start_was_already_over():
    result = compile_with(VerboseRewrites(extra=1500))
    rejected = [c for c in result.candidates if c.predictor == "answer"]
    assert rejected and not any(c.accepted for c in rejected)
    assert "the starting instruction was already over max_instruction_chars=4000" in rejected[0].reason
