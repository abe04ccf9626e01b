"""One loading path for every policy checkpoint: models/base as the base_model stage wrote it (SmolLM2 for the tiny
preset, Qwen for the real ones), a checkpoint on disk, or a Hugging Face Hub name (bf16 and flash-attention 2 on GPU
when installed, SDPA otherwise; on a CPU, decoding steps as plain matrix products)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from components.errors import UserError
from components.models.attention import register_cpu_decode_attention
from components.models.chat_format import IM_END, render_prompt

DTYPES = ("auto", "float32", "bfloat16", "float16")


def resolve_device(device: str | None = None) -> str:
    """`device` as given, or `cuda` when a GPU is visible, else `cpu`."""
    if device and device != "auto":
        return device
    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_dtype(dtype: str, device: str):
    """The torch dtype for `dtype`; `auto` is bfloat16 on a GPU that supports it and float32 elsewhere."""
    if dtype not in DTYPES:
        raise UserError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}")
    if dtype == "auto":
        on_gpu = device.startswith("cuda") and torch.cuda.is_available()
        return torch.bfloat16 if on_gpu and torch.cuda.is_bf16_supported() else torch.float32
    return getattr(torch, dtype)


def attention_implementation(device: str, dtype) -> str:
    """`flash_attention_2` when the `flash_attn` package is installed and the model runs in 16 bits on a GPU; on a
    CPU, SDPA with decoding steps as plain matrix products (components/models/attention.py); `sdpa` otherwise."""
    half = dtype in (torch.bfloat16, torch.float16)
    if device.startswith("cuda") and half and importlib.util.find_spec("flash_attn") is not None:
        return "flash_attention_2"
    if device == "cpu":
        return register_cpu_decode_attention()
    return "sdpa"


def _source(path_or_name: str | Path) -> tuple[str, bool]:
    """(what to pass to `from_pretrained`, whether it is a local directory)."""
    path = Path(path_or_name)
    if path.is_dir():
        return str(path), True
    if path.exists():
        raise UserError(f"{path} is a file; give the directory of a Hugging Face checkpoint")
    text = str(path_or_name)
    # Hub names are "name" or "org/name"; anything else, or an "org/name" whose "org" is a local folder, is a path.
    looks_local = text.startswith((".", "/", "~")) or text.count("/") > 1 or (text.count("/") == 1 and path.parent.is_dir())
    if looks_local:
        raise UserError(f"checkpoint directory {path} does not exist (run the stage that writes it, e.g. `dvc repro`)")
    return str(path_or_name), False


def load_tokenizer(path_or_name: str | Path):
    """The tokenizer of a checkpoint directory or Hub name, with left padding (for batched generation) and a pad
    token (its end-of-text token when the checkpoint defines none)."""
    source, local = _source(path_or_name)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=local)
    except OSError as exc:
        raise UserError(f"cannot load a tokenizer from {source!r}: {exc}. Give a local checkpoint directory, or a "
                        "Hub name on a machine that can reach the Hub") from exc
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = "<|endoftext|>" if "<|endoftext|>" in tokenizer.get_vocab() else tokenizer.eos_token
    return tokenizer


def check_chat_protocol(tokenizer) -> None:
    """Refuse a tokenizer whose own chat template does not render conversations as the agent protocol's token
    segments do (components/models/chat_format.py: ChatML, as Qwen2.5 and SmolLM2 use): the policy would be trained and
    sampled on text its template never produces."""
    end_of_turn_id(tokenizer)
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"},
                {"role": "assistant", "content": "A"}, {"role": "user", "content": "T"}]
    if getattr(tokenizer, "chat_template", None) is None:
        raise UserError("the tokenizer has no chat template; the agent protocol needs a ChatML chat model "
                        "(<|im_start|>role\\n...<|im_end|>), such as Qwen2.5 or SmolLM2 Instruct")
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ours = render_prompt(messages)
    if rendered != ours:
        raise UserError("the model's chat template renders conversations differently from the agent protocol "
                        f"(ChatML):\n template: {rendered!r}\n protocol: {ours!r}\nuse a ChatML instruct model")


def end_of_turn_id(tokenizer) -> int:
    """The id of `<|im_end|>`, the token that ends every assistant turn in the chat protocol."""
    token_id = tokenizer.convert_tokens_to_ids(IM_END)
    if token_id is None or token_id == tokenizer.unk_token_id:
        raise UserError("the tokenizer has no <|im_end|> token: the agent protocol needs a Qwen-style chat format")
    return token_id


def end_of_turn_ids(tokenizer, generation_config=None) -> tuple[int, ...]:
    """The tokens that end an assistant turn on every backend: `<|im_end|>` first, then the model's own
    end-of-sequence tokens where they differ (the tokenizer's, the generation config's: Qwen2.5 Instruct's lists
    `<|endoftext|>` too). A turn that stops on any of them is finished, with that token sampled and trained."""
    ids = [end_of_turn_id(tokenizer)]
    configured = getattr(generation_config, "eos_token_id", None) if generation_config is not None else None
    configured = [configured] if isinstance(configured, int) else list(configured or [])
    for token in [getattr(tokenizer, "eos_token_id", None), *configured]:
        if isinstance(token, int) and token not in ids:
            ids.append(token)
    return tuple(ids)


def load_policy_model(path_or_name: str | Path, dtype: str = "auto", device: str | None = None):
    """Load a causal LM for generation or training: the same call for SmolLM2 (tiny), a random
    smoke model and Qwen.

    Returns the model on `device` (default: `cuda` if visible, else `cpu`) in eval mode; its generation config
    stops at `<|im_end|>` and the model's own end-of-sequence tokens (`end_of_turn_ids`).
    """
    source, local = _source(path_or_name)
    device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, device)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            source,
            dtype=torch_dtype,
            attn_implementation=attention_implementation(device, torch_dtype),
            local_files_only=local,
            use_safetensors=True,  # weights never come from a pickle (pytorch_model.bin)
        )
    except OSError as exc:
        raise UserError(f"cannot load a model from {source!r}: {exc}. Give a local checkpoint directory with "
                        "safetensors weights, or a Hub name on a machine that can reach the Hub") from exc
    tokenizer = load_tokenizer(source)
    ends = end_of_turn_ids(tokenizer, model.generation_config)
    model.generation_config.eos_token_id = ends[0] if len(ends) == 1 else list(ends)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model.to(device).eval()
