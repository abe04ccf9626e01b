"""The GPU path (vLLM rollouts, weight sync, DeepSpeed) is lazily imported and says what to install."""
import importlib.util
from types import SimpleNamespace

import pytest
import torch

from components.errors import UserError
from components.training.rl.engine import build_policy, resolve_backend
from components.training.rl.optim import build_optimizer, deepspeed_config
from components.training.rl.params import RLParams
from components.training.rl.weight_sync import NoWeightSync, VLLMWeightSync, build_weight_sync


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is not None, reason="deepspeed is installed here")
def test_deepspeed_without_the_gpu_extra_says_what_to_install():
    params = RLParams.model_validate({"distributed": {"strategy": "deepspeed", "zero_stage": 3}})
    with pytest.raises(UserError, match=r"pip install 'star-pipeline\[gpu\]'.*strategy: none"):
        build_optimizer(torch.nn.Linear(2, 2), params, total_steps=10)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed here")
def test_vllm_rollouts_without_the_gpu_extra_say_what_to_install():
    rollout = RLParams.model_validate({"rollout": {"backend": "vllm"}}).rollout
    with pytest.raises(UserError, match=r"'vllm' package.*rollout.backend: hf"):
        build_policy(None, None, "models/sft", rollout, seed=0, device="cuda")


def test_auto_backend_is_transformers_on_cpu():
    assert resolve_backend("auto", "cpu") == "hf"
    assert resolve_backend("vllm", "cpu") == "vllm"


def test_deepspeed_config_leaves_accumulation_to_the_trainer():
    config = deepspeed_config(3, max_grad_norm=1.0)
    assert config["zero_optimization"]["stage"] == 3
    assert config["gradient_accumulation_steps"] == 1 and config["gradient_clipping"] == 1.0


class FakeVLLMModel:
    def __init__(self):
        self.loaded = {}

    def load_weights(self, weights):
        self.loaded.update({name: tensor.clone() for name, tensor in weights})


def test_weight_sync_streams_every_parameter_into_a_colocated_vllm_engine_and_resets_its_cache():
    inner = FakeVLLMModel()
    resets = []
    llm = SimpleNamespace(
        llm_engine=SimpleNamespace(model_executor=SimpleNamespace(
            driver_worker=SimpleNamespace(model_runner=SimpleNamespace(model=inner)))),
        reset_prefix_cache=lambda: resets.append(1))
    model = torch.nn.Linear(3, 2)
    sync = build_weight_sync(SimpleNamespace(llm=llm))
    assert isinstance(sync, VLLMWeightSync)
    assert sync.push(model) == 2
    assert torch.equal(inner.loaded["weight"], model.weight.data) and resets == [1]


def test_transformers_rollouts_need_no_weight_sync():
    assert isinstance(build_weight_sync(SimpleNamespace()), NoWeightSync)


class SleepingEngine:
    """A colocated vLLM engine's sleep-mode calls, recorded in order (`LLM.sleep`, `wake_up`, `reset_prefix_cache`)
    around a model whose `load_weights` is recorded too."""

    def __init__(self):
        self.calls = []
        inner = SimpleNamespace(load_weights=lambda pairs: self.calls.extend(f"load {name}" for name, _ in pairs))
        self.llm_engine = SimpleNamespace(model_executor=SimpleNamespace(
            driver_worker=SimpleNamespace(model_runner=SimpleNamespace(model=inner))))

    def sleep(self, level):
        self.calls.append(f"sleep {level}")

    def wake_up(self, tags=None):
        self.calls.append(f"wake {','.join(tags)}")

    def reset_prefix_cache(self):
        self.calls.append("reset")


def test_a_sleep_mode_engine_sleeps_through_the_update_and_wakes_weights_before_its_kv_cache():
    """The order verl's hybrid engine uses: sleep (level 1) before the update; for the push, the weights wake, the
    new ones load, then the KV cache wakes; a second release before a push sleeps once."""
    engine = SleepingEngine()
    sync = build_weight_sync(SimpleNamespace(llm=engine, sleep_mode=True))
    sync.release()
    sync.release()
    assert sync.push(torch.nn.Linear(2, 2)) == 2
    assert engine.calls == ["sleep 1", "wake weights", "load weight", "load bias", "wake kv_cache", "reset"]
    engine.calls.clear()
    sync.push(torch.nn.Linear(2, 2))  # awake already (the push before the first rollout): no wake calls
    assert engine.calls == ["load weight", "load bias", "reset"]


def test_an_engine_without_sleep_mode_is_never_put_to_sleep():
    engine = SleepingEngine()
    sync = build_weight_sync(SimpleNamespace(llm=engine, sleep_mode=False))
    sync.release()
    sync.push(torch.nn.Linear(2, 2))
    assert engine.calls == ["load weight", "load bias", "reset"]
    NoWeightSync().release()  # transformers rollouts: nothing to release


def test_rl_builds_its_vllm_engine_in_sleep_mode_unless_told_not_to(monkeypatch):
    import sys
    import types

    built = []
    vllm = types.ModuleType("vllm")
    vllm.LLM = lambda **kwargs: built.append(kwargs) or SimpleNamespace()
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setattr("components.training.rl.engine.require_gpu_extra", lambda *args: None)
    monkeypatch.setattr("components.agent.vllm_backend.model_generation_config", lambda model: None)
    tokenizer = SimpleNamespace(convert_tokens_to_ids=lambda token: 2, eos_token_id=2, unk_token_id=0)
    for release, expected in ((True, {"enable_sleep_mode": True}), (False, {})):
        rollout = RLParams.model_validate({"rollout": {"backend": "vllm", "release_engine_memory": release}}).rollout
        policy = build_policy(None, tokenizer, "models/sft", rollout, seed=0, device="cuda")
        assert policy.sleep_mode is release
        assert {k: v for k, v in built[-1].items() if k == "enable_sleep_mode"} == expected
