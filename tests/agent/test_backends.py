"""One backend choice for RL and evaluation: vLLM on a GPU when installed, transformers otherwise."""
import pytest

from components.agent import backends
from components.agent.backends import Sampling, checkpoint_policy, resolve_backend


class ChatTokenizer:
    """Just what a policy backend reads from a tokenizer: the `<|im_end|>` id and the pad id."""

    unk_token_id = 3
    pad_token_id = 0

    def convert_tokens_to_ids(self, token: str) -> int:
        return {"<|im_end|>": 1}.get(token, self.unk_token_id)


def test_auto_is_transformers_without_a_gpu_or_without_vllm(monkeypatch):
    monkeypatch.setattr(backends, "vllm_available", lambda: True)
    assert resolve_backend("auto", "cpu") == "hf"
    assert resolve_backend("auto", "cuda:0") == "vllm"
    monkeypatch.setattr(backends, "vllm_available", lambda: False)
    assert resolve_backend("auto", "cuda") == "hf"


def test_a_named_backend_is_kept_and_an_unknown_one_is_refused():
    assert resolve_backend("vllm", "cpu") == "vllm"
    assert resolve_backend("hf", "cuda") == "hf"
    with pytest.raises(ValueError, match="auto, hf, vllm"):
        resolve_backend("tgi")


def test_transformers_samples_from_the_given_model_with_the_sampling_params():
    model = object()
    policy = checkpoint_policy("models/sft", ChatTokenizer(), Sampling(temperature=0.7, top_p=0.9, seed=5,
                                                                       max_batch_size=4), backend="hf", model=model)
    assert type(policy).__name__ == "HFPolicy" and policy.model is model
    assert (policy.temperature, policy.top_p, policy.seed, policy.max_batch_size, policy.greedy) == (0.7, 0.9, 5, 4,
                                                                                                     False)
    assert policy.end_id == 1


def test_transformers_loads_the_checkpoint_when_no_model_is_given(monkeypatch):
    import components.models.loading as loading

    loaded = []
    monkeypatch.setattr(loading, "load_policy_model", lambda path, dtype, device: loaded.append((path, dtype, device)))
    policy = checkpoint_policy("models/rl", ChatTokenizer(), Sampling(greedy=True, dtype="float32"), backend="hf",
                               device="cpu")
    assert loaded == [("models/rl", "float32", "cpu")] and policy.greedy


def test_vllm_loads_the_checkpoint_into_its_own_engine_with_the_sampling_params(monkeypatch):
    import components.agent.vllm_backend as vllm_backend

    class RecordingVLLMPolicy:
        def __init__(self, model, **kwargs):
            self.model, self.kwargs = model, kwargs

    monkeypatch.setattr(vllm_backend, "VLLMPolicy", RecordingVLLMPolicy)
    sampling = Sampling(temperature=1.0, seed=2, dtype="bfloat16", gpu_memory_utilization=0.4, max_model_len=8192)
    policy = checkpoint_policy("models/sft", "tokenizer", sampling, backend="vllm", model=object())
    assert policy.model == "models/sft"
    assert policy.kwargs == {"tokenizer": "tokenizer", "temperature": 1.0, "top_p": 1.0, "greedy": False, "seed": 2,
                             "dtype": "bfloat16", "max_model_len": 8192, "gpu_memory_utilization": 0.4,
                             "sleep_mode": False}
