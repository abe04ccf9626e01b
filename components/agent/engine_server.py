"""The rollout engine process: one `vllm.LLM` behind a Unix socket, token-in/token-out (`engine_protocol.py`).

Run by `engine_client.EngineProcess` with the engine environment's interpreter (`.venv-engine/bin/python -m
components.agent.engine_server ...`, the repository root on PYTHONPATH); it imports only the standard library, torch,
vLLM, safetensors (a vLLM dependency) and the protocol module, never the project's stage packages, whose
dependencies live in the other environment.

It dies with the stage that started it, however the stage ends: the kernel sends it SIGKILL when the stage's main
thread, which started it, exits (PR_SET_PDEATHSIG), and a watchdog thread exits when its stdin, a pipe whose other
end only the stage holds, reads end-of-file (the stage died, or closed it). vLLM runs in this one process
(VLLM_ENABLE_V1_MULTIPROCESSING=0), so no engine-core process of its own can outlive it.

Weights arrive as a safetensors file named by path and load through vLLM's in-place reload
(`model_runner.reload_weights`, in `WeightReceiver`, vLLM's `worker_extension_cls` hook); a tied output layer is
re-tied to the reloaded embeddings and re-packed, and the prefix cache is reset, since its keys and values were
computed with the old weights.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import signal
import socket
import sys
import threading
import time
import traceback

from components.agent.engine_protocol import EngineConnectionClosed, recv_message, send_message

PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int, pdeathsig: bool = True) -> None:
    """Exit when the stage that started this process goes away: with `pdeathsig`, PR_SET_PDEATHSIG (Linux: the
    kernel's SIGKILL when the thread that started this process exits, so the stage asks for it only from its main
    thread), and always a thread that exits on end-of-file of stdin (the stage holds the pipe's write end)."""
    if pdeathsig and sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:  # the stage died before prctl took effect
        os._exit(1)

    def watch() -> None:
        while sys.stdin.buffer.read(1 << 16):
            pass
        os._exit(0)

    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()


class WeightReceiver:
    """Methods vLLM adds to its worker (`worker_extension_cls`); `self` is the worker. (Not named `update_weights`:
    vLLM's CPU worker has a method of that name.)"""

    def receive_weights(self, path: str) -> int:
        """Load the safetensors file at `path` into the model in place (checkpoint names and layouts); re-tie a tied
        output layer to the embeddings. Returns the number of tensors loaded."""
        from safetensors.torch import load_file

        weights = load_file(path)
        self.model_runner.reload_weights(weights_iterator=list(weights.items()), is_checkpoint_format=True)
        if ties_embeddings(self.model_runner.model_config):
            retie_output_layer(self.model_runner.get_model())
        return len(weights)


def ties_embeddings(model_config) -> bool:
    """Whether the served model ties its output layer to its input embeddings (its Hugging Face config's flag)."""
    return bool(getattr(model_config.hf_text_config, "tie_word_embeddings", False))


def retie_output_layer(model) -> None:
    """Point the output layer back at the input embeddings after a reload and re-pack it for the CPU's matmul (the
    reload replaces the embedding's tensor; the output layer kept the old one)."""
    lm_head, embeddings = getattr(model, "lm_head", None), getattr(getattr(model, "model", None), "embed_tokens", None)
    if lm_head is None or embeddings is None:
        raise RuntimeError(f"cannot re-tie the output layer of {type(model).__name__}: expected `lm_head` and "
                           "`model.embed_tokens` (Llama and Qwen2 layouts)")
    lm_head.tie_weights(embeddings)
    lm_head.quant_method.process_weights_after_loading(lm_head)


def build_engine(args):
    """The `vllm.LLM` for the command-line options."""
    import torch
    import vllm

    torch.set_num_threads(args.threads)
    on_cpu = not torch.cuda.is_available()
    if args.sleep_mode == "on" and on_cpu:
        raise ValueError("sleep mode (rl.rollout.release_engine_memory: true) needs a GPU: vLLM's CPU worker "
                         "refuses enable_sleep_mode, and its sleep and wake_up do nothing; set it to auto or false")
    options = dict(model=args.model, dtype=args.dtype, seed=args.seed, max_model_len=args.max_model_len,
                   enable_prefix_caching=True, logprobs_mode="processed_logprobs", skip_tokenizer_init=True,
                   worker_extension_cls="components.agent.engine_server.WeightReceiver",
                   enforce_eager=not args.compile)
    if on_cpu:
        options["kv_cache_memory_bytes"] = int(args.kv_cache_gib * (1 << 30))
    else:
        options["gpu_memory_utilization"] = args.gpu_memory_utilization
        options["enable_sleep_mode"] = args.sleep_mode != "off"
    return vllm.LLM(**options)


def sampling_params(params: dict):
    """vLLM's SamplingParams for one request of the protocol: the sampled token's log-prob, stop only at the given
    token ids (kept in the output), ids only (no detokenisation)."""
    from vllm import SamplingParams

    return SamplingParams(n=1, temperature=params["temperature"], top_p=params["top_p"], top_k=params["top_k"],
                          max_tokens=params["max_tokens"], stop_token_ids=list(params["stop_token_ids"]),
                          ignore_eos=True, seed=params["seed"], logprobs=0, detokenize=False,
                          skip_special_tokens=False)


class Engine:
    """Answers the protocol's requests with one vLLM engine."""

    def __init__(self, llm, model: str):
        import vllm

        self.llm, self.model, self.version = llm, model, vllm.__version__
        self.tied = ties_embeddings(llm.llm_engine.model_config)
        self.sleep_mode = bool(llm.llm_engine.vllm_config.model_config.enable_sleep_mode)

    def handle(self, request: dict) -> dict:
        op = request.get("op")
        if op == "health":
            return {"ok": True, "pid": os.getpid(), "vllm": self.version, "model": self.model, "tied": self.tied,
                    "sleep_mode": self.sleep_mode}
        if op == "generate":
            return {"ok": True, "outputs": self.generate(request["prompts"], request["params"])}
        if op == "load_weights":
            start = time.perf_counter()
            tensors = self.llm.collective_rpc("receive_weights", args=(request["path"],))[0]
            self.llm.reset_prefix_cache()
            return {"ok": True, "tensors": tensors, "seconds": time.perf_counter() - start}
        if op == "sleep":
            self.llm.sleep(level=int(request.get("level", 1)))
            return {"ok": True}
        if op == "wake_up":
            self.llm.wake_up(tags=request.get("tags"))
            return {"ok": True}
        raise ValueError(f"unknown op {op!r}")

    def generate(self, prompts: list[list[int]], params: list[dict]) -> list[dict]:
        from vllm.inputs import TokensPrompt

        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in prompts],
                                    [sampling_params(p) for p in params], use_tqdm=False)
        results = []
        for output in outputs:
            completion = output.outputs[0]
            ids = list(completion.token_ids)
            logprobs = [float(position[token].logprob) for token, position in zip(ids, completion.logprobs or [])]
            results.append({"token_ids": ids, "logprobs": logprobs})
        return results


def serve(engine: Engine, path: str) -> None:
    """Answer requests on the Unix socket `path`, one connection at a time, until a shutdown request."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path + ".binding")
    server.listen(1)
    os.replace(path + ".binding", path)  # the socket appears under its name only once it accepts
    while True:
        conn, _ = server.accept()
        with conn:
            while True:
                try:
                    request = recv_message(conn)
                except EngineConnectionClosed:
                    break
                if request.get("op") == "shutdown":
                    send_message(conn, {"ok": True})
                    return
                try:
                    reply = engine.handle(request)
                except Exception:  # the stage gets the engine's traceback; the engine keeps serving
                    reply = {"ok": False, "error": traceback.format_exc()}
                send_message(conn, reply)


def parse_args(argv: list[str] | None = None):
    parser = argparse.ArgumentParser(description="the rollout engine process (started by engine_client.py)")
    parser.add_argument("--socket", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--parent-pid", type=int, required=True)
    parser.add_argument("--no-pdeathsig", action="store_true",
                        help="started from a thread that may end before the stage: rely on the stdin watchdog")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--kv-cache-gib", type=float, default=1.0, help="CPU: the KV cache's size")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.8)
    parser.add_argument("--sleep-mode", choices=("auto", "on", "off"), default="auto",
                        help="auto: sleep mode where vLLM has it (a GPU)")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model (slower start)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    die_with_parent(args.parent_pid, pdeathsig=not args.no_pdeathsig)
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    engine = Engine(build_engine(args), args.model)
    serve(engine, args.socket)
    os._exit(0)  # vLLM's background threads must not hold the process open


if __name__ == "__main__":
    main()
