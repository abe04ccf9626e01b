"""The vLLM policy backend (GPU rollouts): token-in/token-out generation with prefix caching and continuous
batching. vLLM is imported lazily; without it a clear error says what to install."""
from __future__ import annotations

from components.agent.types import TurnRequest, TurnResult
from components.errors import UserError
from components.models.loading import end_of_turn_ids, load_tokenizer

INSTALL_HINT = "pip install 'star-pipeline[gpu]' (vLLM needs a CUDA GPU)"


def import_vllm():
    """The `vllm` module, or a UserError saying how to install it."""
    try:
        import vllm
    except ImportError as exc:
        raise UserError(f"the vLLM backend needs the vllm package: {INSTALL_HINT}") from exc
    return vllm


def model_generation_config(model):
    """The generation config of the model vLLM loads (None when it has none or cannot be read here)."""
    from transformers import GenerationConfig

    try:
        return GenerationConfig.from_pretrained(str(model))
    except (OSError, ValueError):
        return None


def sampled_logprobs(token_ids: list[int], logprobs) -> list[float] | None:
    """The logprob of each sampled token from vLLM's per-position `{token_id: Logprob}` dicts (None if absent)."""
    if logprobs is None:
        return None
    return [float(position[token].logprob) for token, position in zip(token_ids, logprobs)]


class VLLMPolicy:
    """A `Policy` backed by a vLLM engine (same contract as `HFPolicy`).

    Every request of a turn goes to ONE `LLM.generate` call as token-id prompts; vLLM batches them continuously and
    its prefix cache reuses the shared system prompt and each episode's growing history across turns. Returns the
    sampled ids (ending with the end-of-turn token when the model stopped: `<|im_end|>` or the model's own EOS, as on
    the transformers backend), their logprobs, and the text without the end-of-turn token. `llm` may be passed in (e.g. a colocated engine whose weights the RL trainer updates). `sleep_mode` builds an engine that can sleep
    (`LLM.sleep`/`wake_up`): RL's weight sync puts it to sleep through each update.
    """

    def __init__(self, model: str, tokenizer=None, temperature: float = 1.0, top_p: float = 1.0, top_k: int = -1,
                 greedy: bool = False, seed: int = 0, llm=None, gpu_memory_utilization: float = 0.5,
                 max_model_len: int | None = None, dtype: str = "auto", tensor_parallel_size: int = 1,
                 enable_prefix_caching: bool = True, sleep_mode: bool = False):
        vllm = import_vllm()
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(model)
        self.end_ids = end_of_turn_ids(self.tokenizer, model_generation_config(model))
        self.temperature = 0.0 if greedy else temperature
        self.top_p = 1.0 if greedy else top_p
        self.top_k = -1 if greedy else top_k
        self.seed = seed
        self.calls = 0
        self.llm = llm if llm is not None else vllm.LLM(
            model=str(model), dtype=dtype, seed=seed, gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len, tensor_parallel_size=tensor_parallel_size,
            enable_prefix_caching=enable_prefix_caching,
            **({"enable_sleep_mode": True} if sleep_mode else {}),
        )
        self.sleep_mode = sleep_mode

    def sampling_params(self, request: TurnRequest, index: int):
        """vLLM SamplingParams for one request: stop exactly at the end-of-turn tokens the transformers backend stops
        at (`end_of_turn_ids`, kept in the ids; `ignore_eos` so that vLLM adds no stop of its own), logprob of the
        sampled token, a per-request seed derived from the policy seed, the call and the position."""
        from vllm import SamplingParams

        return SamplingParams(
            n=1, temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
            max_tokens=max(1, request.max_new_tokens), stop_token_ids=list(self.end_ids), ignore_eos=True,
            logprobs=0,
            seed=self.seed + 1_000_003 * self.calls + index, skip_special_tokens=False,
            detokenize=False,
        )

    def generate(self, requests: list[TurnRequest]) -> list[TurnResult]:
        """Sample the next assistant turn for every request in one engine call."""
        from vllm.inputs import TokensPrompt

        if not requests:
            return []
        for request in requests:
            if request.token_ids is None:
                raise ValueError("VLLMPolicy is a token backend: run the loop with a tokenizer")
        prompts = [TokensPrompt(prompt_token_ids=list(r.token_ids)) for r in requests]
        params = [self.sampling_params(r, i) for i, r in enumerate(requests)]
        self.calls += 1
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        return [self._result(out.outputs[0], r) for out, r in zip(outputs, requests)]

    def _result(self, completion, request: TurnRequest) -> TurnResult:
        ids = list(completion.token_ids)[: max(1, request.max_new_tokens)]
        finished = bool(ids) and ids[-1] in self.end_ids
        logprobs = sampled_logprobs(ids, completion.logprobs)
        text = self.tokenizer.decode(ids[:-1] if finished else ids, skip_special_tokens=False)
        return TurnResult(text=text, token_ids=ids, logprobs=logprobs, finished=finished)
