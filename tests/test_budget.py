"""The budget's own rules: metric calls charged all or nothing, prompt-LM calls admitted on their worst case, and
the ``auto`` budgets DSPy's GEPA gives."""

from __future__ import annotations

import dspy
import pytest

from dspy_agentgrad.option_groups import auto_budget
from dspy_agentgrad.runtime.budget import Budget, BudgetExhausted


def test_budget_charges_all_or_nothing():
    budget = Budget(max_metric_calls=5)
    budget.charge(3)
    with pytest.raises(BudgetExhausted):
        budget.charge(3)
    assert budget.metric_calls == 3 and budget.remaining() == 2
    budget.charge(2)
    assert budget.remaining() == 0


def test_prompt_caps_admit_a_call_only_if_its_worst_case_fits():
    budget = Budget(max_prompt_tokens=10)
    budget.settle(budget.reserve("a", 6), 4)
    with pytest.raises(BudgetExhausted, match="4 of 10 tokens paid; the next call could take up to 7"):
        budget.reserve("b", 7)
    budget.settle(budget.reserve("b", 6), 6)
    assert budget.prompt_tokens == 10


@pytest.mark.parametrize("auto", ["light", "medium", "heavy"])
@pytest.mark.parametrize(("n_predictors", "n_val"), [(1, 10), (2, 300), (4, 50), (4, 300), (7, 3)])
def test_auto_budget_equals_dspy_gepa_for_the_same_program_and_data(auto, n_predictors, n_val):
    from dspy.teleprompt.gepa.gepa import AUTO_RUN_SETTINGS

    gepa = dspy.GEPA(metric=lambda *a: 1.0, auto=auto, reflection_lm=dspy.LM("openai/unused"))
    expected = gepa.auto_budget(n_predictors, AUTO_RUN_SETTINGS[auto]["n"], n_val)
    assert auto_budget(auto, n_predictors, n_val) == expected


def test_auto_budget_rejects_unknown_preset():
    with pytest.raises(ValueError, match="auto must be one of"):
        auto_budget("huge", 3, 10)
