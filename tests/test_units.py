"""One pure piece per test: clustering, sampling, budget, journal, paid work, retries, auto budget."""

from __future__ import annotations

import json
import random
import threading
import time

import dspy
import pytest

from dspy_agentgrad.core.batches import BatchSampler
from dspy_agentgrad.core.clustering import random_minibatches, tfidf_groups
from dspy_agentgrad.core.round_rules import RoundRules
from dspy_agentgrad.option_groups import auto_budget
from dspy_agentgrad.program.prompt_text import input_values, instructions, output_fields
from dspy_agentgrad.reporting.paired import PairedChange
from dspy_agentgrad.roles.gradient_groups import GradientGroup, normalize_clusters
from dspy_agentgrad.runtime.budget import Budget, BudgetExhausted
from dspy_agentgrad.runtime.paid_work import PaidWork
from dspy_agentgrad.runtime.retries import RetryPolicy, error_kind, is_transient
from dspy_agentgrad.runtime.store import Memo

# ---- clustering -----------------------------------------------------------------------------------


def test_cyclic_schedule_repeats():
    assert [RoundRules((3, 2, 1), 1, None).minimum(r) for r in range(7)] == [3, 2, 1, 3, 2, 1, 3]


def test_normalize_clusters_drops_bad_members_and_keeps_every_gradient_once():
    raw = [([0, "2", 2, 9, "x"], " fix A "), ([1, 2], "fix B"), ([3], ""), ("not a list", "fix C")]
    groups = normalize_clusters(raw, 4)
    assert groups[:2] == [GradientGroup([0, 2], "fix A"), GradientGroup([1], "fix B")]
    assert sorted(m for g in groups for m in g.members) == [0, 1, 2, 3]
    assert GradientGroup([3], "") in groups  # an empty text leaves its member on its own


def test_tfidf_groups_separates_unrelated_corrections():
    texts = ["always cite the passage title", "cite the passage title always", "answer in lowercase letters only"]
    groups = tfidf_groups(texts)
    assert sorted(map(sorted, groups)) == [[0, 1], [2]]
    assert tfidf_groups([]) == [] and tfidf_groups(["one"]) == [[0]]
    assert tfidf_groups(["the a", "an the"]) == [[0], [1]]  # stop words only: nothing shows them alike, each alone


def test_random_minibatches_cover_every_index_once():
    batches = random_minibatches(7, 3, random.Random(0))
    assert [len(b) for b in batches] == [3, 3, 1] and sorted(sum(batches, [])) == list(range(7))


# ---- batch sampler and budgets -------------------------------------------------------------------


@pytest.mark.parametrize("size, batch_size", [(5, 2), (7, 3), (6, 4), (3, 3), (9, 8), (4, 6)])
def test_batch_sampler_visits_every_example_once_per_epoch_on_many_seeds(size, batch_size):
    # Counted after every batch, no example is ever drawn twice more than another (an example skipped at an
    # epoch's turn would lag by two), and a batch never holds an example twice.
    for seed in range(60):
        sampler, counts = BatchSampler(size, batch_size, random.Random(seed)), [0] * size
        for _ in range(3 * size):
            batch = sampler.next()
            assert len(batch) == len(set(batch)) == min(size, batch_size)
            for index in batch:
                counts[index] += 1
            assert max(counts) - min(counts) <= 1, (seed, counts)


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


# ---- journal and paid work -----------------------------------------------------------------------


def test_memo_survives_a_reload_and_drops_a_torn_last_line(tmp_path):
    memo = Memo(tmp_path)
    memo.put("a", {"x": 1})
    memo.put("b", [1, 2])
    with open(tmp_path / "memo.jsonl", "a", encoding="utf-8") as handle:
        handle.write('{"key": "c", "val')
    again = Memo(tmp_path)
    assert again.loaded == 2 and again.get("a") == {"x": 1} and again.get("b") == [1, 2] and again.get("c") is None
    lines = (tmp_path / "memo.jsonl").read_text().splitlines()
    assert [json.loads(line)["key"] for line in lines if "key" in json.loads(line)] == ["a", "b"]


def test_paid_work_pays_once_per_key_even_when_threads_ask_together(tmp_path):
    paid = []

    def pay():
        paid.append(1)
        time.sleep(0.05)
        return {"v": 42}

    work = PaidWork(Memo(tmp_path), dict, dict)
    results = []
    threads = [threading.Thread(target=lambda: results.append(work.settle("k", pay))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(paid) == 1
    assert sorted(new for _, new in results) == [False, False, False, True]
    assert all(value == {"v": 42} for value, _ in results)
    resumed = PaidWork(Memo(tmp_path), dict, dict)
    assert resumed.settle("k", lambda: pytest.fail("paid again")) == ({"v": 42}, True)
    assert resumed.pending(["k", "j", "j"]) == ["j"]


def test_paid_work_lets_another_thread_retry_after_a_failed_payment(tmp_path):
    work = PaidWork(Memo(None), dict, dict)
    with pytest.raises(RuntimeError):
        work.settle("k", lambda: (_ for _ in ()).throw(RuntimeError("boom")))
    assert work.settle("k", lambda: {"ok": True}) == ({"ok": True}, True)


# ---- retries --------------------------------------------------------------------------------------


class RateLimitError(Exception):
    pass


def test_error_classification():
    assert is_transient(TimeoutError()) and is_transient(ConnectionError()) and is_transient(RateLimitError())
    wrapped = ValueError("wrapper")
    wrapped.__cause__ = RateLimitError("429")
    assert is_transient(wrapped) and error_kind(wrapped) == "transient:ValueError"
    assert error_kind(type("AdapterParseError", (Exception,), {})()) == "parse:AdapterParseError"
    assert error_kind(KeyError("x")) == "error:KeyError" and not is_transient(KeyError("x"))


def test_retry_backoff_doubles(monkeypatch):
    slept = []
    monkeypatch.setattr(time, "sleep", slept.append)
    policy = RetryPolicy(attempts=4, backoff_s=0.5)
    for attempt in (1, 2, 3):
        policy.wait(attempt)
    assert slept == [0.5, 1.0, 2.0]


# ---- DSPy prompt text ------------------------------------------------------------------------------


def test_prompt_text_reads_back_what_the_chat_adapter_wrote():
    import dspy

    class QA(dspy.Signature):
        """Answer briefly."""

        question: str = dspy.InputField()
        answer: str = dspy.OutputField()
        score: list[int] = dspy.OutputField()

    messages = dspy.ChatAdapter().format(QA, demos=[], inputs={"question": "Who?"})
    system, user = messages[0]["content"], messages[-1]["content"]
    assert [name for name, _ in output_fields(system)] == ["answer", "score"]
    assert dict(output_fields(system))["score"] == "list[int]"
    assert instructions(system) == "Answer briefly."
    assert input_values(user) == {"question": "Who?"}


def test_a_change_on_one_example_of_many_is_within_noise_and_a_steady_one_is_not():
    before = [0.2] * 24
    one_jump = PairedChange.of(before, [1.0] + [0.2] * 23)
    assert (one_jump.wins, one_jump.losses, one_jump.ties) == (1, 0, 23)
    assert one_jump.gain == pytest.approx(0.8 / 24) and one_jump.within_noise()
    steady = PairedChange.of(before, [0.3] * 24)
    assert steady.gain == pytest.approx(0.1) and steady.wins == 24 and not steady.within_noise()
    mixed = PairedChange.of([0.0, 1.0, 0.5, 0.5], [1.0, 0.0, 0.5, 0.6])
    assert (mixed.wins, mixed.losses, mixed.ties) == (2, 1, 1) and mixed.within_noise()
    unchanged = PairedChange.of(before, before)
    assert unchanged.gain == 0 and not unchanged.within_noise()
    with pytest.raises(ValueError, match="same examples"):
        PairedChange.of([0.1, 0.2], [0.3])
