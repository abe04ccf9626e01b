"""The GPU path (vLLM rollouts, weight sync, DeepSpeed) is lazily imported and says what to install."""
import importlib.util
from types import SimpleNamespace

import pytest
import torch

from components.errors import UserError
from components.agent.sampling import resolve_backend
from components.training.rl.optim import deepspeed_config
from components.training.rl.params import RLParams
from components.training.rl.rollout_backends import ROLLOUT_BACKENDS, PolicyInputs, rollout_backend, rollout_sampling
from components.training.rl.strategies import build_optimizer
from components.training.rl.weight_sync import EngineWeightSync, NoWeightSync


def engine_policy(rollout, tokenizer=None, dtype: str = "auto"):
    """The rollout policy the trainer builds for `rollout` (RolloutParams) with the vLLM backend."""
    inputs = PolicyInputs(None, tokenizer, "models/sft", rollout_sampling(rollout, seed=0, dtype=dtype), "cpu")
    return rollout_backend(rollout.backend, "cpu").build(inputs)


def engine_sync(engine):
    return ROLLOUT_BACKENDS["vllm"].weight_sync(SimpleNamespace(engine=engine), False)


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is not None, reason="deepspeed is installed here")
def test_deepspeed_without_the_gpu_extra_says_what_to_install():
    params = RLParams.model_validate({"distributed": {"strategy": "deepspeed", "zero_stage": 3}})
    with pytest.raises(UserError, match=r"pip install 'star-pipeline\[gpu\]'.*strategy: none"):
        build_optimizer(torch.nn.Linear(2, 2), params, total_steps=10)


def test_vllm_rollouts_without_the_engine_environment_say_how_to_build_it(monkeypatch):
    monkeypatch.setenv("STAR_ENGINE_PYTHON", "none")
    rollout = RLParams.model_validate({"rollout": {"backend": "vllm"}}).rollout
    with pytest.raises(UserError, match=r"engine environment: run \./scripts/bootstrap\.sh.*backend hf"):
        engine_policy(rollout)


def test_auto_backend_is_transformers_without_the_engine_environment(monkeypatch):
    monkeypatch.setenv("STAR_ENGINE_PYTHON", "none")
    assert resolve_backend("auto", "cpu") == "hf"
    assert resolve_backend("vllm", "cpu") == "vllm"


def test_deepspeed_config_leaves_accumulation_to_the_trainer():
    config = deepspeed_config(3, max_grad_norm=1.0)
    assert config["zero_optimization"]["stage"] == 3
    assert config["gradient_accumulation_steps"] == 1 and config["gradient_clipping"] == 1.0


class RecordingEngine:
    """The calls a weight sync makes on `engine_client.EngineProcess`, in order; `push_weights` keeps the tensors."""

    def __init__(self, sleeps: bool = False):
        self.sleeps, self.calls, self.loaded = sleeps, [], {}

    def push_weights(self, named_tensors):
        pairs = [(name, tensor.clone()) for name, tensor in named_tensors]
        self.loaded.update(pairs)
        self.calls.extend(f"load {name}" for name, _ in pairs)
        return len(pairs)

    def sleep(self, level):
        self.calls.append(f"sleep {level}")

    def wake_up(self, tags=None):
        self.calls.append(f"wake {','.join(tags)}")


def test_weight_sync_sends_every_parameter_to_the_engine():
    engine = RecordingEngine()
    model = torch.nn.Linear(3, 2)
    sync = engine_sync(engine)
    assert isinstance(sync, EngineWeightSync)
    assert sync.push(model) == 2
    assert torch.equal(engine.loaded["weight"], model.weight.data) and sync.pushes == 1


def test_transformers_rollouts_need_no_weight_sync_unless_they_sample_from_a_copy():
    from components.training.rl.weight_sync import ModuleWeightSync

    policy = SimpleNamespace(model=torch.nn.Linear(2, 2))
    assert isinstance(ROLLOUT_BACKENDS["hf"].weight_sync(policy, False), NoWeightSync)
    assert isinstance(ROLLOUT_BACKENDS["hf"].weight_sync(policy, True), ModuleWeightSync)  # a sharded trainer's


def test_a_sleep_mode_engine_sleeps_through_the_update_and_wakes_weights_before_its_kv_cache():
    """The order verl's hybrid engine uses: sleep (level 1) before the update; for the push, the weights wake, the
    new ones load, then the KV cache wakes; a second release before a push sleeps once."""
    engine = RecordingEngine(sleeps=True)
    sync = engine_sync(engine)
    sync.release()
    sync.release()
    assert sync.push(torch.nn.Linear(2, 2)) == 2
    assert engine.calls == ["sleep 1", "wake weights", "load weight", "load bias", "wake kv_cache"]
    engine.calls.clear()
    sync.push(torch.nn.Linear(2, 2))  # awake already (the push before the first rollout): no wake calls
    assert engine.calls == ["load weight", "load bias"]


def test_an_engine_without_sleep_mode_is_never_put_to_sleep():
    engine = RecordingEngine(sleeps=False)
    sync = engine_sync(engine)
    sync.release()
    sync.push(torch.nn.Linear(2, 2))
    assert engine.calls == ["load weight", "load bias"]
    NoWeightSync().release()  # transformers rollouts: nothing to release


def test_rl_asks_for_an_engine_in_sleep_mode_where_the_platform_has_it_unless_told_not_to(monkeypatch):
    import components.agent.vllm_backend as vllm_backend

    started = []

    class RecordingEngineProcess:
        def __init__(self, model, options):
            started.append(options)
            self.options = options

    monkeypatch.setattr(vllm_backend, "EngineProcess", RecordingEngineProcess)
    monkeypatch.setattr("components.training.rl.rollout_backends.require_engine_python", lambda: None)
    monkeypatch.setattr(vllm_backend, "model_generation_config", lambda model: None)
    tokenizer = SimpleNamespace(convert_tokens_to_ids=lambda token: 2, eos_token_id=2, unk_token_id=0)
    for release in (True, False, "auto"):
        rollout = RLParams.model_validate({"rollout": {"backend": "vllm", "release_engine_memory": release}}).rollout
        policy = engine_policy(rollout, tokenizer, dtype="float32")
        assert policy.sleep_mode == release and started[-1].sleep_mode == release
        assert started[-1].dtype == "float32"
