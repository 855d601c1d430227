"""Pseudo-labels in a world whose LM rewords every output with its prompt (see tests/rewording_sim.py)."""

from __future__ import annotations

import pytest
from rewording_sim import TRAIN, RewordingWorld, attribute, kind

from dspy_agentgrad.program.hint_delivery import HINT_FIELD, HINT_HEADER
from dspy_agentgrad.program.hints import PLACEBOS
from dspy_agentgrad.testing import FakeCall

DOUBLE = [k for k in TRAIN if "+" in k]


def _labels_by_example(labels):
    by_example: dict[str, set[str]] = {}
    for name, example in labels:
        by_example.setdefault(example.question, set()).add(name)
    return by_example


@pytest.mark.parametrize("seed", [1, 3, 5])
def test_a_hint_that_only_rewords_an_upstream_output_earns_no_pseudo_label(seed):
    """Batches where pseudo-labels went to 4, 2 and 2 blameless predictors before the placebo control.
    (A placebo can miss by chance: over six seeds 2 blameless labels of 133 remain, see rewording_sim.py.)"""
    labels, _ = attribute(reword=True, seed=seed)
    assert labels, "the world explains some failures"
    blameless = [(name, example.question) for name, example in labels if name not in kind(example)]
    assert blameless == []


@pytest.mark.parametrize("reword", [False, True])
def test_two_predictors_both_at_fault_still_get_both_labels(reword):
    labels, _ = attribute(reword=reword, seed=0)
    doubles = {q: names for q, names in _labels_by_example(labels).items() if any(f"kind={k}" in q for k in DOUBLE)}
    assert doubles, "some double faults are explained"
    for question, names in doubles.items():
        assert names == set(question.split("kind=")[1].split("+")), question


def test_the_fake_lm_sees_no_hint_in_a_placebo_however_it_is_delivered():
    for placebo in PLACEBOS:
        by_field = FakeCall("", "", "Answer.", {"question": "q", HINT_FIELD: placebo.text}, ["answer"])
        by_instruction = FakeCall("", "", f"Answer.\n\n{HINT_HEADER}\n{placebo.text}", {"question": "q"}, ["answer"])
        assert by_field.hint is None and by_instruction.hint is None
    real = FakeCall("", "", "Answer.", {"question": "q", HINT_FIELD: "answer = ans-id1"}, ["answer"])
    assert real.hint == "answer = ans-id1"


def test_the_world_rewords_every_task_output_with_its_prompt():
    world = RewordingWorld()
    call = FakeCall("", "", "Extract.", {"question": "id1 kind=none"}, ["keyword"])
    other = FakeCall("", "", "Extract.", {"question": "id1 kind=none", HINT_FIELD: PLACEBOS[0].text}, ["keyword"])
    first, second = world(call)["keyword"], world(other)["keyword"]
    assert first.split()[0] == second.split()[0] == "id1" and first != second
