"""Secrets stay out of every file, log and LM prompt: header values, and key-like text an error echoes."""

from __future__ import annotations

import logging
import re

import dspy
import pytest
from world import Pipeline, World, feedback_metric, make_data, world_lm

from dspy_agentgrad import AgentGrad
from dspy_agentgrad.config import AgentGradConfig
from dspy_agentgrad.testing import FakeCall, RuleEngine, fake_lm

FAST = dict(auto=None, progress=False)
HEADER_KEY = "hdr-secret-9f8e7d6c5b4a3210"  # only known as a header value: no pattern finds it
API_KEY = "sk-proj-A1b2C3d4E5f6G7h8I9j0"  # the shape of an OpenAI key
TRAIN = make_data({"extract": 2, "notes": 2, "answer": 2, "none": 2})
VAL = make_data({"extract": 1, "notes": 1, "answer": 1, "none": 1}, start=50)


class Gateway(World):
    """A world behind a gateway that rejects the note-taker's calls on kind=answer examples with a 401
    whose body echoes the credentials it was sent; every prompt the optimizer's roles get is recorded."""

    def __init__(self):
        super().__init__()
        self.role_prompts: list[str] = []

    def __call__(self, call: FakeCall):
        if "current_instruction" in call.inputs:
            self.role_prompts.append(call.system + call.user)
        elif call.output_fields == ["notes"] and "kind=answer" in call.inputs["question"]:
            raise dspy.lm15.AuthError(
                f"401 Unauthorized: key {API_KEY} rejected (headers: X-Api-Key: {HEADER_KEY}; Bearer {API_KEY})"
            )
        return super().__call__(call)


class SavableEngine(RuleEngine):
    """A rule engine that ``program.save()`` can record (by its class path), as a real provider LM can be."""

    def dump_state(self) -> dict:
        return {}

    @classmethod
    def load_state(cls, state: dict):
        raise NotImplementedError("not loaded in these tests")


def files_in(folder) -> dict[str, str]:
    return {p.name: p.read_text(encoding="utf-8", errors="replace") for p in folder.rglob("*") if p.is_file()}


def test_header_values_and_echoed_keys_never_reach_files_logs_or_prompts(tmp_path, caplog):
    gateway = Gateway()
    dspy.configure(lm=world_lm(gateway))
    program = Pipeline()
    program.notes.lm = fake_lm(SavableEngine(gateway))
    program.notes.lm.kwargs["extra_headers"] = {"X-Api-Key": HEADER_KEY}  # as dspy.LM(..., extra_headers=...) has
    with caplog.at_level(logging.DEBUG, logger="dspy_agentgrad"):
        compiled = AgentGrad(
            feedback_metric, log_dir=tmp_path, config=AgentGradConfig.from_options(max_rounds=2, **FAST)
        ).compile(program, trainset=TRAIN, valset=VAL)
    result = compiled.detailed_results
    assert result.program_errors.get("error:LMAuthError", 0) > 0  # the 401s happened and were journaled
    written = files_in(tmp_path)
    assert {"memo.jsonl", "optimized_program.json", "result.json", "report.html"} <= set(written)
    for name, text in written.items():
        assert HEADER_KEY not in text and API_KEY not in text, name
    assert "[redacted]" in written["memo.jsonl"]  # the error text is kept, the secrets are not
    assert re.search(r'"X-Api-Key": "\[redacted\]"', written["optimized_program.json"])
    assert gateway.role_prompts and not any(HEADER_KEY in p or API_KEY in p for p in gateway.role_prompts)
    assert HEADER_KEY not in caplog.text and API_KEY not in caplog.text
    assert program.notes.lm.kwargs["extra_headers"] == {"X-Api-Key": HEADER_KEY}  # the user's program is untouched
    assert compiled.notes.lm.kwargs["extra_headers"] == {"X-Api-Key": HEADER_KEY}  # and the result still works


def test_a_metric_error_echoing_a_key_is_redacted_in_the_log_and_journal(tmp_path, caplog):
    dspy.configure(lm=world_lm(World()))

    def metric(gold, pred, trace=None):
        if "kind=notes" in gold.question:
            raise RuntimeError(f"judge call failed: Authorization: Bearer {API_KEY}")
        return feedback_metric(gold, pred)

    with caplog.at_level(logging.WARNING, logger="dspy_agentgrad"):
        AgentGrad(metric, log_dir=tmp_path, config=AgentGradConfig.from_options(max_rounds=1, **FAST)).compile(
            Pipeline(), trainset=TRAIN, valset=VAL
        )
    assert "judge call failed" in caplog.text and API_KEY not in caplog.text
    assert API_KEY not in (tmp_path / "memo.jsonl").read_text()


URL_KEY = "urlkey-5e6f7a8b9c0d"  # only in the userinfo of a per-predictor LM's api_base
AWS_SECRET = "aws-9a8b7c6d5e4f3a2b"  # only known by its setting's name
AZURE_TOKEN = "az-1f2e3d4c5b6a7980"


def test_every_credential_of_a_per_predictor_lm_is_kept_out_of_log_dir_and_mlflow(tmp_path, monkeypatch):
    mlflow = pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri((tmp_path / "mlruns").as_uri())
    world = World()
    dspy.configure(lm=world_lm(world))
    program = Pipeline()
    program.notes.lm = fake_lm(SavableEngine(world))
    program.notes.lm.kwargs.update(
        api_base=f"http://user:{URL_KEY}@gateway.internal/v1",
        aws_secret_access_key=AWS_SECRET,
        azure_ad_token=AZURE_TOKEN,
        extra_headers={"X-Api-Key": HEADER_KEY},
    )
    try:
        AgentGrad(
            feedback_metric,
            log_dir=tmp_path / "log",
            use_mlflow=True,
            config=AgentGradConfig.from_options(max_rounds=1, **FAST),
        ).compile(program, trainset=TRAIN, valset=VAL)
    finally:
        while mlflow.active_run() is not None:
            mlflow.end_run()
        mlflow.set_tracking_uri(previous)
    copies = [p for p in (tmp_path / "mlruns").rglob("optimized_program.json")]
    assert copies and (tmp_path / "log" / "optimized_program.json").exists()
    for folder in (tmp_path / "log", tmp_path / "mlruns"):
        for name, text in files_in(folder).items():
            for secret in (URL_KEY, AWS_SECRET, AZURE_TOKEN, HEADER_KEY):
                assert secret not in text, (folder.name, name, secret)
    saved = (tmp_path / "log" / "optimized_program.json").read_text()
    assert "gateway.internal" in saved and "[redacted]" in saved  # the endpoint is kept, its user part is not
    assert program.notes.lm.kwargs["aws_secret_access_key"] == AWS_SECRET  # the user's program is untouched


def test_a_setting_counting_tokens_is_no_credential():
    from dspy_agentgrad.runtime.redaction import credential_name

    assert [credential_name(n) for n in ("api_key", "aws_secret_access_key", "azure_ad_token", "X-Api-Key")] == [
        True
    ] * 4
    assert not any(credential_name(n) for n in ("max_tokens", "max_completion_tokens", "keyword", "temperature"))
