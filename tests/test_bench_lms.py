"""LM specs with per-LM settings, and several endpoints of one model behind a litellm Router,
tested against OpenAI-compatible fake servers on 127.0.0.1 (one of them failing)."""

from __future__ import annotations

import json
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import dspy
import pytest

from benchmarks.lms import LMSpecError, describe_spec, make_lm, parse_spec

REPLY = "[[ ## answer ## ]]\nfrom {port}\n\n[[ ## completed ## ]]"


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        server = self.server
        with server.lock:
            server.requests.append({"body": body, "auth": self.headers.get("Authorization")})
        if server.failing:
            payload, status = b'{"error": {"message": "server down", "type": "server_error"}}', 500
        else:
            message = {"role": "assistant", "content": REPLY.format(port=server.server_port)}
            payload, status = (
                json.dumps(
                    {
                        "id": "cmpl-1",
                        "object": "chat.completion",
                        "created": 0,
                        "model": body.get("model", "m"),
                        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                        "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
                    }
                ).encode(),
                200,
            )
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


class FakeServers:
    """Fake OpenAI-compatible chat servers, each in its own thread; stopped on exit."""

    def __init__(self, failing: list[bool]):
        self.servers = []
        for fails in failing:
            server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
            server.failing, server.requests, server.lock = fails, [], threading.Lock()
            server.daemon_threads = True
            self.servers.append(server)
        self.threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in self.servers]

    def __enter__(self):
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc):
        for server in self.servers:
            server.shutdown()
            server.server_close()
        for thread in self.threads:
            thread.join(timeout=5)

    @property
    def bases(self) -> list[str]:
        return [f"http://127.0.0.1:{s.server_port}/v1" for s in self.servers]


@pytest.fixture(autouse=True)
def _no_cost_map_download(monkeypatch):
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def test_spec_forms_parse_to_the_same_settings(tmp_path):
    inline = parse_spec(
        "openai/qwen3-8b@http://a:8000/v1,http://b:8000/v1?temperature=0.6&top_p=0.95&top_k=20"
        '&max_tokens=16000&api_key_env=VLLM_KEY&extra_body={"chat_template_kwargs":{"enable_thinking":false}}'
    )
    as_json = {
        "model": "openai/qwen3-8b",
        "api_base": ["http://a:8000/v1", "http://b:8000/v1"],
        "temperature": 0.6,
        "top_p": 0.95,
        "top_k": 20,
        "max_tokens": 16000,
        "api_key_env": "VLLM_KEY",
        "extra_body": {"chat_template_kwargs": {"enable_thinking": False}},
    }
    path = tmp_path / "qwen.json"
    path.write_text(json.dumps(as_json))
    assert inline == parse_spec(json.dumps(as_json)) == parse_spec(str(path))
    assert inline.top_k == 20 and inline.api_bases == ["http://a:8000/v1", "http://b:8000/v1"]
    assert parse_spec("openai/gpt-5-mini").api_bases == []


def test_a_key_in_a_spec_is_refused_and_never_recorded(monkeypatch):
    with pytest.raises(LMSpecError, match="api_key_env"):
        parse_spec('{"model": "openai/x", "api_key": "sk-secret"}')
    monkeypatch.setenv("MY_SERVER_KEY", "sk-secret-value")
    recorded = json.dumps(describe_spec("openai/x@http://h/v1?api_key_env=MY_SERVER_KEY"))
    assert "MY_SERVER_KEY" in recorded and "sk-secret-value" not in recorded
    monkeypatch.delenv("MY_SERVER_KEY")
    with pytest.raises(LMSpecError, match="MY_SERVER_KEY"):
        make_lm("openai/x@http://h/v1?api_key_env=MY_SERVER_KEY")
    with pytest.raises(LMSpecError, match="top_k"):
        parse_spec("openai/x?top_k=many")


def test_one_server_gets_the_per_lm_settings_and_the_key_from_the_named_variable(monkeypatch):
    monkeypatch.setenv("MY_SERVER_KEY", "sk-local")
    with FakeServers([False]) as fake:
        spec = {
            "model": "openai/qwen3-8b",
            "api_base": fake.bases[0],
            "api_key_env": "MY_SERVER_KEY",
            "temperature": 0.6,
            "top_p": 0.95,
            "top_k": 20,
            "max_tokens": 300,
            "extra_body": {"chat_template_kwargs": {"enable_thinking": False}},
        }
        lm = make_lm(json.dumps(spec), cache=False)
        with dspy.context(lm=lm):
            answer = dspy.Predict("question -> answer")(question="q").answer
        request = fake.servers[0].requests[-1]
    assert answer == f"from {fake.servers[0].server_port}"
    body = request["body"]
    assert (body["temperature"], body["top_p"], body["top_k"], body["max_tokens"]) == (0.6, 0.95, 20, 300)
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    assert request["auth"] == "Bearer sk-local"


def test_router_spreads_calls_over_servers_and_fails_over_from_a_broken_one():
    with FakeServers([False, True, False]) as fake:
        spec = {
            "model": "openai/qwen3-8b",
            "api_base": fake.bases,
            "temperature": 0.6,
            "top_k": 20,
            "extra_body": {"chat_template_kwargs": {"enable_thinking": False}},
        }
        lm = make_lm(json.dumps(spec), cache=False)
        predict = dspy.Predict("question -> answer")
        with dspy.context(lm=lm):
            answers = [predict(question=f"question {i}").answer for i in range(12)]
        healthy = {fake.servers[0].server_port, fake.servers[2].server_port}
        served = Counter(int(a.split()[-1]) for a in answers)
        bodies = [r["body"] for s in fake.servers for r in s.requests]
        broken_hits = len(fake.servers[1].requests)
    assert set(served) <= healthy and sum(served.values()) == 12  # every call answered, none by the broken one
    assert len(served) == 2  # both healthy servers took calls
    assert broken_hits <= 2  # the broken server is cooled down after failing, not retried on every call
    assert all(b["temperature"] == 0.6 and b["top_k"] == 20 for b in bodies)
    assert all(b["chat_template_kwargs"] == {"enable_thinking": False} for b in bodies)


def test_runner_rejects_a_bad_spec_with_a_message(tmp_path):
    from benchmarks import run

    with pytest.raises(SystemExit, match="api_key_env"):
        run.main(["--bench", "pupa", "--task-lm", '{"model": "openai/x", "api_key": "sk-1"}', "--out", str(tmp_path)])
