"""One backend choice for RL and evaluation: the vLLM engine where its environment exists, transformers otherwise."""
import pytest

from components.agent.backends import checkpoint_policy
from components.agent.sampling import Sampling, resolve_backend


class ChatTokenizer:
    """Just what a policy backend reads from a tokenizer: the `<|im_end|>` id and the pad id."""

    unk_token_id = 3
    pad_token_id = 0

    def convert_tokens_to_ids(self, token: str) -> int:
        return {"<|im_end|>": 1}.get(token, self.unk_token_id)


def test_auto_is_the_engine_where_its_environment_exists_and_says_so(monkeypatch, tmp_path, capsys):
    python = tmp_path / "bin" / "python"
    python.parent.mkdir()
    python.write_text("")
    monkeypatch.setenv("STAR_ENGINE_PYTHON", str(python))
    assert resolve_backend("auto", "cpu") == "vllm"
    assert f"backend auto -> vllm (the engine environment {python})" in capsys.readouterr().err
    monkeypatch.setenv("STAR_ENGINE_PYTHON", "none")
    assert resolve_backend("auto", "cuda") == "hf"
    assert "backend auto -> hf (no engine environment" in capsys.readouterr().err


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


def test_vllm_loads_the_checkpoint_into_its_own_engine_with_the_sampling_params(monkeypatch, tmp_path):
    import json

    import components.agent.vllm_backend as vllm_backend
    from components.agent.engine_client import EngineOptions

    class RecordingVLLMPolicy:
        def __init__(self, model, **kwargs):
            self.model, self.kwargs = model, kwargs

    monkeypatch.setattr(vllm_backend, "VLLMPolicy", RecordingVLLMPolicy)
    sampling = Sampling(temperature=1.0, seed=2, dtype="bfloat16", gpu_memory_utilization=0.4, max_model_len=8192)
    policy = checkpoint_policy("models/sft", "tokenizer", sampling, backend="vllm", model=object())
    assert policy.model == "models/sft"
    assert policy.kwargs == {"tokenizer": "tokenizer", "temperature": 1.0, "top_p": 1.0, "greedy": False, "seed": 2,
                             "options": EngineOptions(dtype="bfloat16", seed=2, max_model_len=8192,
                                                      gpu_memory_utilization=0.4, sleep_mode="auto")}
    # dtype auto: the checkpoint's own (vLLM's auto would run a float32 checkpoint in bfloat16)
    (tmp_path / "config.json").write_text(json.dumps({"dtype": "float32"}))
    policy = checkpoint_policy(tmp_path, "tokenizer", Sampling(), backend="vllm")
    assert policy.kwargs["options"].dtype == "float32"


def test_no_engine_is_prestarted_for_transformers_or_without_an_engine_environment(monkeypatch):
    from components.agent import engine_client
    from components.agent.sampling import prestart_engine

    monkeypatch.setattr(engine_client.Launch, "start", lambda *a: pytest.fail("no engine should start"))
    assert not prestart_engine("models/sft", Sampling(greedy=True), backend="hf")
    monkeypatch.setenv("STAR_ENGINE_PYTHON", "none")
    assert not prestart_engine("models/sft", Sampling(greedy=True), backend="auto")
    assert not prestart_engine("models/sft", Sampling(greedy=True), backend="vllm")  # the policy says how to fix it
    assert not engine_client.PRESTARTED
