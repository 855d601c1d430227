"""Hard cases (failures no hint fixes) and the reflections on them (``reflect_hard_cases``)."""

from __future__ import annotations

import dspy
import pytest
from world import Pipeline, World, feedback_metric, make_data, world_lm

from dspy_agentgrad import AgentGrad
from dspy_agentgrad.config import AgentGradConfig

FAST = dict(progress=False, auto=None, cluster_schedule=(1,), train_batch_size=6, max_rounds=4)
UPSTREAM_BROKE = ("no document found", "no answer found")


class Deaf(World):
    """No step follows a hint, so every failure is a hard case. Asked to reflect on a step, the prompt LM
    finds nothing to change where the step was fed garbage by an earlier one (as a careful LM would), and
    otherwise asks for the step's fix."""

    def __init__(self):
        super().__init__(hint_follow_rate=0.0)

    def _role(self, call):
        if "step_output" in call.inputs:  # the reflection role
            self.calls["reflect"] += 1
            if any(text in call.inputs["step_inputs"] for text in UPSTREAM_BROKE):
                return {"gradient": "No change needed."}
        return super()._role(call)


def optimize(world: World, threads: int = 1, **options):
    dspy.configure(lm=world_lm(world))
    train = make_data({"extract": 3, "notes": 3, "none": 2})
    val = make_data({"none": 6, "extract": 2, "notes": 2}, start=50)
    optimizer = AgentGrad(
        feedback_metric, num_threads=threads, config=AgentGradConfig.from_options(**{**FAST, **options})
    )
    return optimizer.compile(Pipeline(), trainset=train, valset=val).detailed_results


@pytest.mark.parametrize("threads", [1, 4])
def test_reflections_fix_a_program_whose_steps_ignore_every_hint(threads):
    off = optimize(Deaf(), threads, reflect_hard_cases=False)
    assert off.best_val_score == off.initial_val_score and not off.candidates
    assert sum(r.hard_cases for r in off.rounds) > 0 and "could be attributed" in off.why_unchanged()

    world = Deaf()
    on = optimize(world, threads)
    assert on.best_val_score == 1.0 > on.initial_val_score
    assert "FIX-extract" in on.final_instructions["extract"] and "FIX-notes" in on.final_instructions["notes"]
    assert on.final_instructions["answer"] == on.initial_instructions["answer"]
    # a step fed garbage by an earlier one is left alone: only the faulty steps get candidates
    assert {c.predictor for c in on.candidates} == {"extract", "notes"}
    assert on.rounds[0].reflected > 0 and world.calls["reflect"] > 0
    assert all(b.predictor is None for b in on.blame)  # still reported as hard cases: nobody was blamed


def test_reflections_are_the_same_at_1_and_4_threads_and_each_hard_case_is_reflected_on_once():
    runs = {}
    for threads in (1, 4):
        world = World(hint_follow_rate=0.0)
        result = optimize(world, threads)
        runs[threads] = ([(c.round, c.predictor, c.instruction, c.accepted) for c in result.candidates], world)
    assert runs[1][0] == runs[4][0]
    # every rewrite wins here (the fake prompt LM always names the asked step's fix), so each hard case is asked
    # about once per step and instruction: never more reflections than (hard case, step, instruction) triples
    result = optimize(World(hint_follow_rate=0.0), 1, max_rounds=8)
    asked = sum(r.reflected for r in result.rounds)
    hard = sum(r.hard_cases for r in result.rounds)
    assert 0 < asked <= 3 * hard


def test_the_paper_preset_does_not_reflect():
    result = optimize(Deaf(), preset="paper", cluster_schedule=(1,))
    assert all(r.reflected == 0 for r in result.rounds) and not result.candidates
