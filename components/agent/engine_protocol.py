"""The wire format between a stage and its rollout engine process (`engine_server.py`, run in .venv-engine).

Both sides import this module, so it uses the standard library only. Each message is one JSON object preceded by its
length (8 bytes, big-endian) over a Unix stream socket. Requests carry an `op`:

    {"op": "health"}                        -> {"ok": true, "pid": ..., "vllm": "0.32.0", "model": ...}
    {"op": "generate", "prompts": [[ids]], "params": [{...}]}
                                            -> {"ok": true, "outputs": [{"token_ids": [...], "logprobs": [...]}]}
    {"op": "load_weights", "path": "/dev/shm/....safetensors"}
                                            -> {"ok": true, "tensors": n, "seconds": s}
    {"op": "shutdown"}                      -> {"ok": true}, then the process exits

and a failed request answers {"ok": false, "error": "<the engine's traceback>"}. Weights travel as a safetensors file
named by path (on tmpfs: no copy through the socket, and no pickle anywhere); token ids and log-probs as JSON
numbers (Python's float repr round-trips every float64 exactly). `params` of a generate request are `SAMPLING_KEYS`.
"""
from __future__ import annotations

import json
import socket
import struct

HEADER = struct.Struct(">Q")
SAMPLING_KEYS = ("temperature", "top_p", "top_k", "max_tokens", "stop_token_ids", "seed")


class EngineConnectionClosed(ConnectionError):
    """The other side closed the socket (the engine exited, or the client went away)."""


def send_message(sock: socket.socket, message: dict) -> None:
    """Write one length-prefixed JSON message."""
    body = json.dumps(message, separators=(",", ":")).encode()
    sock.sendall(HEADER.pack(len(body)) + body)


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise EngineConnectionClosed("the socket closed in the middle of a message" if chunks or left != size
                                         else "the socket closed")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def recv_message(sock: socket.socket) -> dict:
    """Read one length-prefixed JSON message."""
    (size,) = HEADER.unpack(_read_exactly(sock, HEADER.size))
    return json.loads(_read_exactly(sock, size))
