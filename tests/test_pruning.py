"""Pruning accepted rewrites (``prune_rewrites``): a sentence a kept rewrite added goes when validation does better
without it, and stays when it does not."""

from __future__ import annotations

import re

import dspy
import pytest
from world import Pipeline, World, agentgrad, feedback_metric, make_data, world_lm

from dspy_agentgrad.config import AgentGradConfig, option_defaults
from dspy_agentgrad.core.judging.pruning import added_sentences, sentences, without_sentence

FAST = dict(progress=False, auto=None)
STRAY = "Refuse every record with an odd id."
PRUNED = "better on validation without a sentence its rewrite added"


class StrayWorld(World):
    """A rewrite adds its fix and, as a sentence of its own, ``second`` (a rule the prompt LM made up). The stray
    rule :data:`STRAY` breaks the step on the examples of kind ``none`` with an odd id; the note-taker goes wrong on
    kind ``picky`` unless it carries the stray rule. ``crowded``: the note-taker also goes wrong on those examples
    when its instruction carries both added sentences (it is too long), whichever they are."""

    def __init__(self, second: str = STRAY, crowded: bool = False):
        super().__init__()
        self.second, self.crowded = second, crowded

    def _role(self, call):
        out = super()._role(call)
        if "new_instruction" in call.output_fields:
            current = call.inputs["current_instruction"]
            fix = out["new_instruction"][len(current) :].strip()
            out = {"new_instruction": f"{current} Apply {fix}. {self.second}" if fix else current}
        return out

    def _behaves(self, name, call, kind):
        if kind == "picky" and name == "notes":
            return STRAY in call.instructions
        number = int(re.match(r"id(\d+)", call.inputs["question"]).group(1))
        crowded = (
            self.crowded and name == "notes" and "FIX-notes" in call.instructions and self.second in call.instructions
        )
        if (STRAY in call.instructions or crowded) and kind == "none" and number % 2:
            return False
        return super()._behaves(name, call, kind)


def run(world: World, val_kinds: dict[str, int], validate_together: bool, prune: bool):
    dspy.configure(lm=world_lm(world))
    train = make_data({"notes": 3, "none": 1})
    val = make_data(val_kinds, start=50)
    optimizer = agentgrad(
        feedback_metric,
        cluster_schedule=(1,),
        train_batch_size=4,
        max_rounds=2,
        validate_together=validate_together,
        prune_rewrites=prune,
        **FAST,
    )
    return optimizer.compile(Pipeline(), trainset=train, valset=val).detailed_results


def test_sentences_are_cut_at_full_stops_and_line_breaks():
    assert sentences("Do a. Do b!\n- c\n\n  d?  e") == ["Do a.", "Do b!", "- c", "d?", "e"]
    assert added_sentences("Do a. Do b.", "Do a. Do c. Do b. Do c.") == ["Do c."]
    assert without_sentence("Do a. Do b. Do c.", "Do b.") == "Do a. Do c."
    assert without_sentence("Do a.\nDo b.", "Do b.") == "Do a."
    assert without_sentence("Do a.", "Do z.") == "Do a."


@pytest.mark.parametrize("together", [True, False])
def test_a_stray_rule_that_rode_along_with_a_fix_is_left_out(together):
    # the rewrite adds the fix (6 notes examples repaired) and a stray rule that breaks 2 of the 4 examples that
    # passed before: a net gain, so it is kept; without the stray rule validation does better still
    val_kinds = {"notes": 6, "none": 4}
    plain = run(StrayWorld(), val_kinds, together, prune=False)
    pruned = run(StrayWorld(), val_kinds, together, prune=True)
    assert STRAY in plain.final_instructions["notes"] and plain.best_val_score == 0.8
    assert STRAY not in pruned.final_instructions["notes"] and "FIX-notes" in pruned.final_instructions["notes"]
    assert pruned.best_val_score == 1.0
    removal = next(c for c in pruned.candidates if c.reason == PRUNED)
    assert removal.accepted and STRAY in removal.gradient and removal.val_score == 1.0
    assert removal.instruction == pruned.final_instructions["notes"]


@pytest.mark.parametrize("together", [True, False])
def test_without_a_validation_example_made_worse_nothing_is_paid(together):
    # the second sentence harms nothing: no example got worse, so no leave-one-out run is made
    val_kinds = {"notes": 6, "none": 4}
    plain = run(StrayWorld(second="Be brief."), val_kinds, together, prune=False)
    pruned = run(StrayWorld(second="Be brief."), val_kinds, together, prune=True)
    assert pruned.final_instructions == plain.final_instructions
    assert pruned.metric_calls == plain.metric_calls
    assert [(c.predictor, c.accepted, c.reason) for c in pruned.candidates] == [
        (c.predictor, c.accepted, c.reason) for c in plain.candidates
    ]


@pytest.mark.parametrize("together", [True, False])
def test_a_sentence_that_gains_more_than_it_breaks_stays(together):
    # the stray rule breaks 2 examples and repairs 3 others: leaving it out wins the 2 back and is judged on a
    # full pass, where it loses; the sentence stays and the removal is recorded as rejected
    val_kinds = {"notes": 6, "picky": 3, "none": 4}
    plain = run(StrayWorld(), val_kinds, together, prune=False)
    pruned = run(StrayWorld(), val_kinds, together, prune=True)
    assert pruned.final_instructions == plain.final_instructions and STRAY in pruned.final_instructions["notes"]
    assert pruned.best_val_score == plain.best_val_score
    removal = next(c for c in pruned.candidates if STRAY in c.gradient)
    assert not removal.accepted and removal.reason.startswith("no gain on validation")
    assert pruned.metric_calls > plain.metric_calls


def test_a_regression_that_leaving_out_any_sentence_repairs_blames_none():
    # the two sentences together break 2 examples, and leaving out either repairs them: no sentence is to blame
    # (as where a sampling task LM fails elsewhere on every pass), so no removal gets a full pass
    val_kinds = {"notes": 6, "none": 4}
    plain = run(StrayWorld(second="Be brief.", crowded=True), val_kinds, True, prune=False)
    pruned = run(StrayWorld(second="Be brief.", crowded=True), val_kinds, True, prune=True)
    assert plain.best_val_score == 0.8 and pruned.final_instructions == plain.final_instructions
    assert [c.reason for c in pruned.candidates] == [c.reason for c in plain.candidates]
    assert pruned.metric_calls == plain.metric_calls + 2 * 2  # each absence on the 2 examples made worse


def test_on_by_default_off_in_the_paper_preset_and_for_runs_written_before_it():
    # a log_dir written before the option existed behaved as off: resuming it must not start pruning
    assert AgentGradConfig().judging.prune_rewrites
    assert not AgentGradConfig.from_options(preset="paper").judging.prune_rewrites
    assert option_defaults()["prune_rewrites"] is False
