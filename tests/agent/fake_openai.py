"""A local OpenAI-compatible chat server for tests (stdlib `http.server` on 127.0.0.1, in a thread).

`FakeOpenAI(answer)` serves `POST /v1/chat/completions`: `answer(body, n)` gets the request JSON and its 0-based
arrival number and returns `(status, reply_text_or_error, delay_s)`. Every request is recorded in `requests`.
"""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

Answer = Callable[[dict, int], tuple[int, str, float]]


def completion(text: str, finish_reason: str = "stop") -> dict:
    return {"id": "chatcmpl-test", "object": "chat.completion", "model": "test",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "finish_reason": finish_reason}]}


class FakeOpenAI:
    def __init__(self, answer: Answer, finish_reason: str = "stop"):
        self.answer = answer
        self.finish_reason = finish_reason
        self.requests: list[dict] = []
        self.headers: list[dict] = []
        self.statuses: list[int] = []
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # keep test output clean
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                with server._lock:
                    number = len(server.requests)
                    server.requests.append(body)
                    server.headers.append(dict(self.headers))
                status, text, delay = server.answer(body, number)
                if delay:
                    time.sleep(delay)
                with server._lock:
                    server.statuses.append(status)
                payload = (json.dumps(completion(text, server.finish_reason)) if status == 200
                           else json.dumps({"error": {"message": text}})).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout test)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self._server.server_address[1]}/v1"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> "FakeOpenAI":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
