"""The vLLM backend without a GPU: a clear install hint, and the logprob extraction."""
from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import pytest

from components.agent.vllm_backend import sampled_logprobs
from components.errors import UserError


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed here")
def test_missing_vllm_says_which_extra_to_install(tmp_path):
    from components.agent.vllm_backend import VLLMPolicy

    with pytest.raises(UserError, match=r"pip install 'star-pipeline\[gpu\]'"):
        VLLMPolicy(str(tmp_path))


def test_sampled_logprobs_reads_the_chosen_token_at_each_position():
    positions = [{11: SimpleNamespace(logprob=-0.5), 3: SimpleNamespace(logprob=-2.0)},
                 {2: SimpleNamespace(logprob=-0.1)}]
    assert sampled_logprobs([11, 2], positions) == [-0.5, -0.1]
    assert sampled_logprobs([11, 2], None) is None


class FakeLLM:
    """A stand-in for `vllm.LLM` with vLLM's stop rule: a request stops at the first of its `stop_token_ids`, or at
    the tokenizer's EOS unless `ignore_eos`. Every request samples `script`."""

    def __init__(self, script: list[int], eos_id: int):
        self.script, self.eos_id = script, eos_id

    def generate(self, prompts, params, use_tqdm=False):
        outputs = []
        for p in params:
            ids = []
            for token in self.script[: p.max_tokens]:
                ids.append(token)
                if token in p.stop_token_ids or (token == self.eos_id and not p.ignore_eos):
                    break
            logprobs = [{t: SimpleNamespace(logprob=-0.25)} for t in ids]
            outputs.append(SimpleNamespace(outputs=[SimpleNamespace(token_ids=ids, logprobs=logprobs)]))
        return outputs


@pytest.fixture
def fake_vllm(monkeypatch):
    """Just enough of the `vllm` package for VLLMPolicy: SamplingParams and TokensPrompt."""
    import sys
    import types

    vllm, inputs = types.ModuleType("vllm"), types.ModuleType("vllm.inputs")
    vllm.SamplingParams = lambda **kwargs: SimpleNamespace(**kwargs)
    inputs.TokensPrompt = lambda prompt_token_ids: {"prompt_token_ids": prompt_token_ids}
    vllm.inputs = inputs
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.inputs", inputs)


def test_both_backends_end_a_turn_on_the_models_own_eos_as_on_im_end(fake_vllm, small_model_factory, smol_tokenizer,
                                                                     tmp_path):
    """A model whose generation config ends sequences on `<|endoftext|>` as well (Qwen2.5 Instruct's does): a turn
    that samples it is finished on vLLM's path, with the token and its log-prob kept, as the transformers path ends
    it; before, vLLM stopped there but marked the turn unfinished and the episode ended as a token limit."""
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
    llm = FakeLLM(script=[300, 301, eos, 302, 303], eos_id=eos)
    vllm_policy = VLLMPolicy(str(tmp_path), tokenizer=smol_tokenizer, llm=llm)
    assert hf.end_ids == vllm_policy.end_ids == (im_end, eos)

    request = TurnRequest(messages=[], token_ids=[1, 2, 3], max_new_tokens=8, episode_id="e0")
    (turn,) = vllm_policy.generate([request])
    assert turn.finished and turn.token_ids == [300, 301, eos] and turn.logprobs == [-0.25] * 3
    assert cut_at_end_of_turn([300, 301, eos, 302, 303], hf.end_ids, 8) == ([300, 301, eos], True)
    (params,) = [vllm_policy.sampling_params(request, 0)]
    assert params.ignore_eos and params.stop_token_ids == [im_end, eos]  # vLLM adds no stop of its own

    llm.script = [300, im_end, 302]
    assert vllm_policy.generate([request])[0].token_ids == [300, im_end]
    llm.script = [300] * 20  # no end token within the budget: unfinished, cut at max_new_tokens
    (cut,) = vllm_policy.generate([request])
    assert not cut.finished and len(cut.token_ids) == 8
