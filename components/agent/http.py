"""A policy backed by any OpenAI-compatible chat endpoint (a vLLM server, an API): the endpoint teacher, served models.

Requests of one turn go out concurrently through a thread pool; transient failures (5xx, 429, timeouts, connection
errors) are retried with exponential backoff; an endpoint that stays dead raises `EndpointError` saying so. The API
key is read from an environment variable whose *name* is configured, so the key never enters params or logs.
"""
from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx

from components.agent.types import TurnPolicy, TurnRequest, TurnResult
from components.errors import UserError

RETRYABLE_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}


class EndpointError(UserError):
    """The chat endpoint refused a request or stayed unreachable after every retry."""


@dataclass(frozen=True)
class EndpointConfig:
    """Where and how to call the endpoint. `api_key_env` names the environment variable holding the key."""

    base_url: str
    model: str
    api_key_env: str | None = None
    temperature: float = 0.0
    top_p: float = 1.0
    concurrency: int = 8
    timeout_s: float = 120.0
    max_retries: int = 4
    backoff_s: float = 1.0


def chat_url(base_url: str) -> str:
    """The chat-completions URL for a base URL given with or without the `/v1` suffix."""
    base = base_url.rstrip("/")
    return f"{base}/chat/completions" if base.endswith("/v1") else f"{base}/v1/chat/completions"


def backoff_delay(attempt: int, base_s: float) -> float:
    """Seconds to wait before retry number `attempt` (0-based): base * 2^attempt."""
    return base_s * (2 ** attempt)


def chat_payload(config: EndpointConfig, messages: list[dict], max_tokens: int) -> dict:
    """The JSON body of one chat-completions request (messages stripped to role and content)."""
    return {
        "model": config.model,
        "messages": [{"role": m["role"], "content": m["content"]} for m in messages],
        "max_tokens": max_tokens,
        "temperature": config.temperature,
        "top_p": config.top_p,
    }


def parse_choice(body: dict) -> TurnResult:
    """The first choice of a chat-completions response as a turn; `finish_reason == "length"` means truncated."""
    try:
        choice = body["choices"][0]
        text = choice["message"]["content"] or ""
    except (KeyError, IndexError, TypeError):
        raise EndpointError(f"the endpoint answered without choices[0].message.content: {str(body)[:200]}") from None
    return TurnResult(text=text, finished=choice.get("finish_reason") != "length")


class OpenAIChatClient:
    """A small, thread-safe client for `/v1/chat/completions` with retries and backoff."""

    def __init__(self, config: EndpointConfig, transport: httpx.BaseTransport | None = None):
        self.config = config
        self.url = chat_url(config.base_url)
        headers = {"Content-Type": "application/json"}
        if config.api_key_env:
            key = os.environ.get(config.api_key_env)
            if not key:
                raise EndpointError(f"environment variable {config.api_key_env} (endpoint.api_key_env) is not set; "
                                    "export the API key there, or set api_key_env: null for an open endpoint")
            headers["Authorization"] = f"Bearer {key}"
        self._client = httpx.Client(timeout=config.timeout_s, headers=headers, transport=transport)

    def close(self) -> None:
        self._client.close()

    def complete(self, messages: list[dict], max_tokens: int) -> TurnResult:
        """One chat completion, retried on transient failures; raises `EndpointError` when retries run out."""
        payload = chat_payload(self.config, messages, max_tokens)
        last_problem = ""
        for attempt in range(self.config.max_retries + 1):
            if attempt:
                time.sleep(backoff_delay(attempt - 1, self.config.backoff_s))
            try:
                response = self._client.post(self.url, json=payload)
            except (httpx.TimeoutException, httpx.TransportError) as exc:
                last_problem = f"{type(exc).__name__}: {exc}"
                continue
            if response.status_code in RETRYABLE_STATUS:
                last_problem = f"HTTP {response.status_code}: {response.text[:200]}"
                continue
            if response.status_code >= 400:
                raise EndpointError(f"{self.url} refused the request with HTTP {response.status_code}: "
                                    f"{response.text[:300]} (check the model name and the endpoint's settings)")
            return parse_choice(response.json())
        raise EndpointError(f"{self.url} did not answer after {self.config.max_retries + 1} tries "
                            f"(last problem: {last_problem}); check that the server is running and reachable, "
                            "or raise endpoint.timeout_s / endpoint.max_retries")


class OpenAIChatPolicy(TurnPolicy):
    """The `Policy` interface over an OpenAI-compatible endpoint: every request of a turn in parallel."""

    def __init__(self, config: EndpointConfig, transport: httpx.BaseTransport | None = None):
        self.client = OpenAIChatClient(config, transport=transport)
        self._pool = ThreadPoolExecutor(max_workers=max(1, config.concurrency), thread_name_prefix="chat")

    def generate(self, requests: list[TurnRequest]) -> list[TurnResult]:
        futures = [self._pool.submit(self.client.complete, r.messages, r.max_new_tokens) for r in requests]
        return [f.result() for f in futures]

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.client.close()
