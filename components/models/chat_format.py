"""The ChatML text format (Qwen2.5, SmolLM2 Instruct): special tokens and how messages render as text.

The models layer checks a tokenizer's own chat template against it (`loading.check_chat_protocol`); the agent's token
bookkeeping (`components/agent/tokens.py`) builds a trajectory's token segments from it. No torch or transformers.
"""
from __future__ import annotations

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
GENERATION_PROMPT = f"{IM_START}assistant\n"
CHAT_SPECIAL_TOKENS = (IM_START, IM_END, "<|endoftext|>")


def neutralise_special_tokens(text: str) -> str:
    """Break chat special-token text (e.g. `<|im_end|>`) so that it encodes as plain text, not as a control token."""
    for token in CHAT_SPECIAL_TOKENS:
        text = text.replace(token, token.replace("|", "\u2502"))
    return text


def render_message(message: dict) -> str:
    """One chat message in the Qwen format, without a trailing newline."""
    return f"{IM_START}{message['role']}\n{message['content']}{IM_END}"


def render_prompt(messages: list[dict]) -> str:
    """The prompt text of a conversation: every message, then the assistant generation prompt."""
    return "".join(render_message(m) + "\n" for m in messages) + GENERATION_PROMPT
