"""The OpenAI-compatible policy against a local chat server: answers, retries, timeouts, dead endpoints."""
import socket

import pytest

from components.agent.http import EndpointConfig, EndpointError, OpenAIChatPolicy, backoff_delay, chat_url
from components.agent.types import TurnRequest

from .fake_openai import FakeOpenAI


def request(text: str = "hello", max_new_tokens: int = 64) -> TurnRequest:
    return TurnRequest(messages=[{"role": "user", "content": text, "extra": "dropped"}],
                       max_new_tokens=max_new_tokens)


def config(server: FakeOpenAI, **overrides) -> EndpointConfig:
    return EndpointConfig(**{"base_url": server.base_url, "model": "teacher", "backoff_s": 0.01,
                             "timeout_s": 2.0, **overrides})


def test_chat_url_accepts_base_urls_with_or_without_v1():
    assert chat_url("http://h:8000") == "http://h:8000/v1/chat/completions"
    assert chat_url("http://h:8000/v1/") == "http://h:8000/v1/chat/completions"


def test_backoff_doubles_each_retry():
    assert [backoff_delay(k, 0.5) for k in range(4)] == [0.5, 1.0, 2.0, 4.0]


def test_every_request_of_a_turn_is_answered_in_order():
    with FakeOpenAI(lambda body, n: (200, "echo " + body["messages"][-1]["content"], 0.0)) as server:
        policy = OpenAIChatPolicy(config(server, concurrency=4))
        results = policy.generate([request(f"q{i}") for i in range(6)])
        policy.close()
    assert [r.text for r in results] == [f"echo q{i}" for i in range(6)]
    assert all(r.finished for r in results)
    assert server.requests[0]["model"] == "teacher" and server.requests[0]["max_tokens"] == 64
    assert set(server.requests[0]["messages"][0]) == {"role", "content"}


def test_server_errors_are_retried_until_an_answer_comes():
    with FakeOpenAI(lambda body, n: (500, "overloaded", 0.0) if n < 2 else (200, "ok", 0.0)) as server:
        policy = OpenAIChatPolicy(config(server))
        assert policy.generate([request()])[0].text == "ok"
    assert server.statuses == [500, 500, 200]


def test_timeouts_are_retried():
    with FakeOpenAI(lambda body, n: (200, "slow" if n == 0 else "fast", 1.0 if n == 0 else 0.0)) as server:
        policy = OpenAIChatPolicy(config(server, timeout_s=0.3))
        assert policy.generate([request()])[0].text == "fast"
    assert len(server.requests) == 2


def test_a_length_stop_marks_the_turn_unfinished():
    with FakeOpenAI(lambda body, n: (200, "cut", 0.0), finish_reason="length") as server:
        assert OpenAIChatPolicy(config(server)).generate([request()])[0].finished is False


def test_client_errors_are_not_retried_and_say_what_happened():
    with FakeOpenAI(lambda body, n: (400, "model 'teacher' not found", 0.0)) as server:
        with pytest.raises(EndpointError, match="HTTP 400.*not found"):
            OpenAIChatPolicy(config(server)).generate([request()])
    assert len(server.requests) == 1


def test_a_dead_endpoint_fails_clearly_after_the_retries():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    policy = OpenAIChatPolicy(EndpointConfig(base_url=f"http://127.0.0.1:{port}/v1", model="m", max_retries=2,
                                             backoff_s=0.01, timeout_s=0.5))
    with pytest.raises(EndpointError, match="did not answer after 3 tries.*server is running"):
        policy.generate([request()])


def test_a_dead_endpoint_error_does_not_show_the_password_in_its_url():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    policy = OpenAIChatPolicy(EndpointConfig(base_url=f"http://bob:s3cret@127.0.0.1:{port}/v1", model="m",
                                             max_retries=0, timeout_s=0.5))
    with pytest.raises(EndpointError) as caught:
        policy.generate([request()])
    assert f"http://***@127.0.0.1:{port}/v1/chat/completions did not answer" in str(caught.value)
    assert "s3cret" not in str(caught.value)


def test_the_api_key_comes_from_the_named_environment_variable(monkeypatch):
    monkeypatch.setenv("TEACHER_KEY", "sk-test-123")
    with FakeOpenAI(lambda body, n: (200, "ok", 0.0)) as server:
        OpenAIChatPolicy(config(server, api_key_env="TEACHER_KEY")).generate([request()])
    assert server.headers[0]["Authorization"] == "Bearer sk-test-123"
    monkeypatch.delenv("TEACHER_KEY")
    with pytest.raises(EndpointError, match="TEACHER_KEY"):
        OpenAIChatPolicy(EndpointConfig(base_url="http://127.0.0.1:9/v1", model="m", api_key_env="TEACHER_KEY"))
