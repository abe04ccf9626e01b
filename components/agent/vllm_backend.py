"""The vLLM policy backend: token-in/token-out turns from the rollout engine process (`engine_client.py`: vLLM in
its own environment, .venv-engine, on CPU or GPU), with vLLM's continuous batching and prefix caching.

The end-of-turn rule is the transformers backend's: a turn ends at the first `end_of_turn_ids` token (`<|im_end|>`
or the model's own end-of-sequence tokens), kept in the ids with its log-prob; vLLM adds no stop of its own
(`ignore_eos`). The log-probs are of the sampling distribution (logits / temperature; greedy: the plain
distribution), as the transformers backend reports them; with top_p < 1 or top_k, vLLM's are of the truncated,
renormalised distribution (`logprobs_mode: processed_logprobs`).
"""
from __future__ import annotations

from components.agent.engine_client import EngineOptions, EngineProcess
from components.agent.hf import cut_at_end_of_turn
from components.agent.types import TurnPolicy, TurnRequest, TurnResult
from components.models.loading import end_of_turn_ids, load_tokenizer

SEED_STRIDE = 1_000_003  # per-request seeds: policy seed + stride * call + position in the call


def model_generation_config(model):
    """The generation config of the model the engine loads (None when it has none or cannot be read here)."""
    from transformers import GenerationConfig

    try:
        return GenerationConfig.from_pretrained(str(model))
    except (OSError, ValueError):
        return None


class VLLMPolicy(TurnPolicy):
    """A `Policy` backed by the rollout engine (same contract as `HFPolicy`).

    Every request of a turn goes to ONE engine call as token-id prompts; vLLM batches them continuously and its prefix
    cache reuses the shared system prompt and each episode's growing history across turns. Returns the sampled ids
    (ending with the end-of-turn token when the model stopped), their log-probs, and the text without the end-of-turn
    token. `engine` may be passed in (the RL trainer's engine, whose weights it pushes after each update; a greedy
    twin of a sampling policy); otherwise one is started for `model` with `options` (`close` stops it)."""

    def __init__(self, model: str, tokenizer=None, temperature: float = 1.0, top_p: float = 1.0, top_k: int = -1,
                 greedy: bool = False, seed: int = 0, engine: EngineProcess | None = None,
                 options: EngineOptions | None = None, end_ids: tuple[int, ...] | None = None):
        if not greedy and temperature <= 0:
            raise ValueError("temperature must be > 0 when sampling; use greedy=True for argmax decoding")
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(model)
        self.end_ids = tuple(end_ids) if end_ids is not None else end_of_turn_ids(self.tokenizer,
                                                                                   model_generation_config(model))
        self.greedy = greedy
        self.temperature = 0.0 if greedy else temperature
        self.top_p = 1.0 if greedy else top_p
        self.top_k = -1 if greedy or not top_k else top_k
        self.seed = seed
        self.calls = 0
        self.owns_engine = engine is None
        self.engine = engine if engine is not None else EngineProcess(model, options or EngineOptions(seed=seed))
        self.sleep_mode = self.engine.options.sleep_mode

    def reseed(self, seed: int) -> None:
        """Restart the per-request seeds at `seed` (the RL engine reseeds each step from (seed, step))."""
        self.seed, self.calls = seed, 0

    def sampling_params(self, request: TurnRequest, index: int) -> dict:
        """The engine's sampling params for one request (`engine_protocol.SAMPLING_KEYS`): stop exactly at the
        end-of-turn tokens, a per-request seed derived from the policy seed, the call and the position."""
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k,
                "max_tokens": max(1, request.max_new_tokens), "stop_token_ids": list(self.end_ids),
                "seed": (self.seed + SEED_STRIDE * self.calls + index) % (2**63)}

    def generate(self, requests: list[TurnRequest]) -> list[TurnResult]:
        """Sample the next assistant turn for every request in one engine call."""
        if not requests:
            return []
        if any(r.token_ids is None for r in requests):
            raise ValueError("VLLMPolicy is a token backend: run the loop with a tokenizer so requests carry "
                             "token_ids")
        params = [self.sampling_params(r, i) for i, r in enumerate(requests)]
        self.calls += 1
        outputs = self.engine.generate([r.token_ids for r in requests], params)
        return [self._result(out, r) for out, r in zip(outputs, requests)]

    def _result(self, output: dict, request: TurnRequest) -> TurnResult:
        ids, finished = cut_at_end_of_turn(list(output["token_ids"]), self.end_ids, max(1, request.max_new_tokens))
        text = self.tokenizer.decode(ids[:-1] if finished else ids, skip_special_tokens=False)
        return TurnResult(text=text, token_ids=ids, logprobs=list(output["logprobs"])[: len(ids)], finished=finished)

    def twin(self, greedy: bool = True) -> VLLMPolicy:
        """A policy over the same engine (and weights) with greedy decoding: evaluation during training."""
        return VLLMPolicy("", tokenizer=self.tokenizer, greedy=greedy, seed=self.seed, engine=self.engine,
                          end_ids=self.end_ids)

    def close(self) -> None:
        """Stop the engine if this policy started it."""
        if self.owns_engine:
            self.engine.close()
