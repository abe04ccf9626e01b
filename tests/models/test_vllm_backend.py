"""The vLLM backend's rules without an engine process: the end-of-turn rule shared with the transformers backend, the
sampling params it sends, and a clear error where the engine environment is missing. (The real engine:
tests/agent/test_engine.py.)"""
from __future__ import annotations

import pytest

from components.agent.engine_client import EngineOptions


class ScriptedEngine:
    """Stands in for `engine_client.EngineProcess` with vLLM's stop rule: a request stops at the first of its
    `stop_token_ids` (kept in the output) or at `max_tokens`. Every request samples `script`."""

    def __init__(self, script: list[int]):
        self.script = script
        self.options = EngineOptions()
        self.params: list[dict] = []

    def generate(self, prompts, params):
        self.params.extend(params)
        outputs = []
        for p in params:
            ids = []
            for token in self.script[: p["max_tokens"]]:
                ids.append(token)
                if token in p["stop_token_ids"]:
                    break
            outputs.append({"token_ids": ids, "logprobs": [-0.25] * len(ids)})
        return outputs


def test_a_missing_engine_environment_says_how_to_build_it(monkeypatch, tmp_path):
    from components.agent.engine_client import EngineError, EngineProcess

    monkeypatch.setenv("STAR_ENGINE_PYTHON", "none")
    with pytest.raises(EngineError, match=r"\./scripts/bootstrap\.sh"):
        EngineProcess(tmp_path)
    with pytest.raises(EngineError, match="not found"):
        EngineProcess(tmp_path, python=tmp_path / "missing" / "python")


def test_both_backends_end_a_turn_on_the_models_own_eos_as_on_im_end(small_model_factory, smol_tokenizer, tmp_path):
    """A model whose generation config ends sequences on `<|endoftext|>` as well (Qwen2.5 Instruct's does): a turn
    that samples it is finished on vLLM's path, with the token and its log-prob kept, as the transformers path ends
    it."""
    import json

    from components.agent.hf import HFPolicy, cut_at_end_of_turn
    from components.agent.types import TurnRequest
    from components.agent.vllm_backend import VLLMPolicy
    from components.models.checkpoints import save_checkpoint
    from components.models.loading import load_policy_model

    im_end, eos = smol_tokenizer.convert_tokens_to_ids("<|im_end|>"), smol_tokenizer.convert_tokens_to_ids(
        "<|endoftext|>")
    assert im_end != eos
    save_checkpoint(small_model_factory(hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1,
                                        intermediate_size=32), smol_tokenizer, tmp_path, stage="test")
    config = json.loads((tmp_path / "generation_config.json").read_text())
    (tmp_path / "generation_config.json").write_text(json.dumps({**config, "eos_token_id": [im_end, eos]}))

    hf = HFPolicy(load_policy_model(tmp_path, dtype="float32", device="cpu"), smol_tokenizer)
    engine = ScriptedEngine(script=[300, 301, eos, 302, 303])
    vllm_policy = VLLMPolicy(str(tmp_path), tokenizer=smol_tokenizer, engine=engine)
    assert hf.end_ids == vllm_policy.end_ids == (im_end, eos)

    request = TurnRequest(messages=[], token_ids=[1, 2, 3], max_new_tokens=8, episode_id="e0")
    (turn,) = vllm_policy.generate([request])
    assert turn.finished and turn.token_ids == [300, 301, eos] and turn.logprobs == [-0.25] * 3
    assert cut_at_end_of_turn([300, 301, eos, 302, 303], hf.end_ids, 8) == ([300, 301, eos], True)
    assert engine.params[-1]["stop_token_ids"] == [im_end, eos]

    engine.script = [300, im_end, 302]
    assert vllm_policy.generate([request])[0].token_ids == [300, im_end]
    engine.script = [300] * 20  # no end token within the budget: unfinished, cut at max_new_tokens
    (cut,) = vllm_policy.generate([request])
    assert not cut.finished and len(cut.token_ids) == 8


def test_each_request_gets_its_own_seed_and_greedy_sends_temperature_zero(smol_tokenizer):
    from components.agent.types import TurnRequest
    from components.agent.vllm_backend import SEED_STRIDE, VLLMPolicy

    engine = ScriptedEngine(script=[5])
    sampler = VLLMPolicy("", tokenizer=smol_tokenizer, temperature=0.7, top_p=0.9, seed=3, engine=engine,
                         end_ids=(2,))
    requests = [TurnRequest(messages=[], token_ids=[1], max_new_tokens=4) for _ in range(2)]
    sampler.generate(requests)
    sampler.generate(requests[:1])
    assert [p["seed"] for p in engine.params] == [3, 4, 3 + SEED_STRIDE]
    assert {(p["temperature"], p["top_p"], p["top_k"]) for p in engine.params} == {(0.7, 0.9, -1)}
    twin = sampler.twin()
    assert twin.engine is engine and twin.end_ids == (2,) and not twin.owns_engine
    twin.generate(requests[:1])
    assert (engine.params[-1]["temperature"], engine.params[-1]["top_p"]) == (0.0, 1.0)
    with pytest.raises(ValueError, match="token backend"):
        sampler.generate([TurnRequest(messages=[{"role": "user", "content": "hi"}])])


def fake_engine_python(tmp_path, body: str):
    """An executable standing in for the engine's interpreter: runs `body` as a shell script."""
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\n" + body + "\n")
    python.chmod(0o755)
    return python


def test_an_engine_that_dies_while_starting_is_reported_with_its_log(tmp_path):
    from components.agent.engine_client import EngineError, EngineProcess

    python = fake_engine_python(tmp_path, 'echo "ValueError: no model at $6" >&2; exit 3')
    with pytest.raises(EngineError, match=r"exited with status 3 while starting(.|\n)*ValueError: no model at"):
        EngineProcess(tmp_path / "model", python=python)


def test_an_engine_that_never_gets_ready_times_out_with_its_log(tmp_path):
    from components.agent.engine_client import EngineError, EngineOptions, EngineProcess

    python = fake_engine_python(tmp_path, 'echo "loading weights" >&2; exec sleep 60')
    with pytest.raises(EngineError, match=r"did not become ready within 1 s(.|\n)*loading weights") as error:
        EngineProcess(tmp_path / "model", EngineOptions(startup_timeout_s=1.0), python=python)
    assert "raise the startup timeout" in str(error.value)
