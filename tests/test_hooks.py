"""User hooks on the fake world: callbacks, optimize_predictors, instruction_proposer, embedding clustering."""

from __future__ import annotations

import dspy
import pytest
from world import Pipeline, World, agentgrad, feedback_metric, instructions, make_data, world_lm

from dspy_agentgrad import AgentGrad, AgentGradCallback, RewriteRequest
from dspy_agentgrad.config import AgentGradConfig
from dspy_agentgrad.core.clustering import embedding_groups

FAST = dict(progress=False)
TRAIN = {"extract": 3, "notes": 3, "answer": 3, "none": 3}
VAL = {"extract": 2, "notes": 2, "answer": 2, "none": 2}


def optimizer(**kwargs) -> AgentGrad:
    return agentgrad(feedback_metric, **{"auto": None, "max_rounds": 3, **FAST, **kwargs})


@pytest.fixture
def world():
    w = World()
    dspy.configure(lm=world_lm(w))
    return w


def data():
    return make_data(TRAIN), make_data(VAL, start=100)


class Recorder(AgentGradCallback):
    def __init__(self):
        self.events = []

    def on_run_start(self, event):
        self.events.append(("run_start", event))

    def on_validation_scored(self, event):
        self.events.append(("validation", event))

    def on_round_start(self, event):
        self.events.append(("round_start", event))

    def on_attribution(self, event):
        self.events.append(("attribution", event))

    def on_candidate_proposed(self, event):
        self.events.append(("proposed", event))

    def on_candidate_accepted(self, event):
        self.events.append(("accepted", event))

    def on_candidate_rejected(self, event):
        self.events.append(("rejected", event))

    def on_round_end(self, event):
        self.events.append(("round_end", event))

    def on_run_end(self, event):
        self.events.append(("run_end", event))

    def kinds(self, kind):
        return [e for k, e in self.events if k == kind]


# ---- callbacks ------------------------------------------------------------------------------------


def test_callbacks_receive_every_event_in_order_and_counts_match_the_result(world):
    recorder = Recorder()
    train, val = data()
    result = optimizer(callbacks=[recorder]).compile(Pipeline(), trainset=train, valset=val)
    result = result.detailed_results
    names = [k for k, _ in recorder.events]
    assert names[0] == "run_start" and names[1] == "validation" and names[-1] == "run_end"
    start = recorder.events[0][1]
    assert (start.predictors, start.n_train, start.n_val, start.resumed) == (
        ["answer", "extract", "notes"],
        12,
        8,
        False,
    )
    # each round: start, attribution, then per candidate (proposed ->) verdict, then end
    rounds = [i for i, n in enumerate(names) if n == "round_start"]
    assert len(rounds) == len(result.rounds) == len(recorder.kinds("round_end"))
    for i in rounds:
        assert names[i + 1] == "attribution"
    assert len(recorder.kinds("accepted")) == len(result.accepted) > 0
    assert len(recorder.kinds("rejected")) == len(result.rejected)
    assert len(recorder.kinds("proposed")) == sum(c.instruction is not None for c in result.candidates)
    assert [e.record for e in recorder.kinds("round_end")] == result.rounds
    end = recorder.kinds("run_end")[0]
    assert (end.best_score, end.metric_calls, end.rounds) == (result.best_val_score, result.metric_calls, len(rounds))
    assert end.stop_reason == result.stop_reason
    attributed = [e.report.counts() for e in recorder.kinds("attribution")]
    assert attributed == [r.attributed for r in result.rounds]


def test_a_callback_that_raises_does_not_end_the_run(world, caplog):
    class Broken(AgentGradCallback):
        def on_round_end(self, event):
            raise RuntimeError("observer bug")

    train, val = data()
    program = optimizer(callbacks=[Broken()]).compile(Pipeline(), trainset=train, valset=val)
    assert program.detailed_results.best_val_score == 1.0
    assert "observer bug" in caplog.text


def test_an_object_without_event_methods_is_refused():
    with pytest.raises(TypeError, match="AgentGradCallback"):
        optimizer(callbacks=[object()])


# ---- optimize_predictors ----------------------------------------------------------------------------


def test_only_the_named_predictors_change_and_the_others_are_still_blamed(world):
    train, val = data()
    program = optimizer(optimize_predictors=["notes"]).compile(Pipeline(), trainset=train, valset=val)
    result = program.detailed_results
    before, after = instructions(Pipeline()), instructions(program)
    assert after["answer"] == before["answer"] and after["extract"] == before["extract"]
    assert "FIX-notes" in after["notes"]
    assert {c.predictor for c in result.candidates} == {"notes"}
    assert result.rounds[0].attributed["extract"] == 3 and result.rounds[0].attributed["answer"] == 3
    assert world.calls["gradient"] == sum(r.attributed["notes"] for r in result.rounds)


def test_unknown_predictor_names_are_a_clear_error(world):
    train, val = data()
    with pytest.raises(ValueError, match=r"unknown names \['summarize'\].*\['answer', 'extract', 'notes'\]"):
        optimizer(optimize_predictors=["summarize"]).compile(Pipeline(), trainset=train, valset=val)
    with pytest.raises(ValueError, match="non-empty list"):
        optimizer(optimize_predictors=[])


# ---- instruction_proposer ---------------------------------------------------------------------------


def test_a_custom_instruction_proposer_replaces_the_rewrite_role(world, tmp_path):
    requests: list[RewriteRequest] = []

    def proposer(request: RewriteRequest) -> str:
        requests.append(request)
        return f"{request.current_instruction} Custom FIX-{request.predictor}."

    train, val = data()
    agent = optimizer(instruction_proposer=proposer, log_dir=tmp_path)
    program = agent.compile(Pipeline(), trainset=train, valset=val)
    assert world.calls["rewrite"] == 0
    assert {r.predictor for r in requests} == {"answer", "extract", "notes"}
    first = requests[0]
    assert first.step_signature.startswith("inputs: ") and "FIX-" in first.generalized_gradient
    assert len(first.gradients) >= 1 and first.current_instruction == instructions(Pipeline())[first.predictor]
    assert all("Custom FIX-" in text for text in instructions(program).values())
    assert program.detailed_results.best_val_score == 1.0
    # journaled like the built-in role: compiling again from the same log_dir does not ask again
    asked = len(requests)
    agent.compile(Pipeline(), trainset=train, valset=val)
    assert len(requests) == asked


def test_a_proposer_that_returns_a_non_string_is_counted_as_a_failed_rewrite(world):
    train, val = data()
    result = (
        optimizer(instruction_proposer=lambda request: 42, max_rounds=1, retry_attempts=1)
        .compile(Pipeline(), trainset=train, valset=val)
        .detailed_results
    )
    failures = result.prompt_role_failures
    assert failures["rewrite"] == failures["rewrite:error:TypeError"] == len(result.candidates) > 0
    assert all(c.reason == "rewrite failed" and not c.accepted for c in result.candidates)


def test_instruction_proposer_must_be_callable():
    with pytest.raises(TypeError, match="instruction_proposer must be callable"):
        optimizer(instruction_proposer="rewrite it")


# ---- embedding clustering ------------------------------------------------------------------------------


def topic_embedder(texts: list[str]) -> list[list[float]]:
    """A deterministic fake embedding: one axis per fix token, so gradients group by predictor fixed."""
    axes = ("FIX-extract", "FIX-notes", "FIX-answer")
    return [[1.0 if axis in text else 0.0 for axis in axes] + [0.1] for text in texts]


def test_embedding_groups_join_close_vectors_and_split_far_ones():
    vectors = [[1, 0, 0], [0.98, 0.05, 0], [0, 1, 0], [0, 0.97, 0.1], [0, 0, 1]]
    assert embedding_groups(vectors) == [[0, 1], [2, 3], [4]]
    assert embedding_groups([[1, 2]]) == [[0]] and embedding_groups([]) == []


def test_embedding_clustering_groups_gradients_with_the_users_embedder(world):
    seen: list[list[str]] = []

    def embedder(texts):
        seen.append(list(texts))
        return topic_embedder(texts)

    train, val = data()
    result = (
        optimizer(clustering="embedding", embedder=embedder)
        .compile(Pipeline(), trainset=train, valset=val)
        .detailed_results
    )
    assert seen and world.calls["abstract"] == 0
    assert result.best_val_score == 1.0
    assert sorted(c.cluster_size for c in result.candidates if c.round == 0) == [3, 3, 3]


def test_a_failing_embedder_falls_back_to_tfidf_and_is_counted(world, caplog):
    def broken(texts):
        raise ValueError("no embedding service")

    train, val = data()
    result = (
        optimizer(clustering="embedding", embedder=broken).compile(Pipeline(), trainset=train, valset=val)
    ).detailed_results
    assert result.prompt_role_failures["embed:error:ValueError"] > 0
    assert "grouping its" in caplog.text and result.best_val_score == 1.0


def test_embedding_clustering_needs_an_embedder_and_an_embedder_needs_it():
    with pytest.raises(ValueError, match="needs embedder="):
        optimizer(clustering="embedding")
    with pytest.raises(ValueError, match="only with clustering='embedding'"):
        optimizer(embedder=topic_embedder)


def test_a_model_name_becomes_a_dspy_embedder():
    agent = optimizer(clustering="embedding", embedder="openai/text-embedding-3-small")
    assert isinstance(agent.embedder, dspy.Embedder)


# ---- use_mlflow without mlflow installed ------------------------------------------------------------


def test_without_mlflow_the_option_says_how_to_install(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_mlflow(name, *args, **kwargs):
        if name == "mlflow":
            raise ImportError("No module named 'mlflow'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_mlflow)
    with pytest.raises(ImportError, match=r"pip install 'dspy-agentgrad\[mlflow\]'"):
        AgentGrad(feedback_metric, auto=None, use_mlflow=True, config=AgentGradConfig.from_options(max_rounds=1))
