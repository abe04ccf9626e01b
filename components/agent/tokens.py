"""Token bookkeeping for the Qwen chat format: the segments a trajectory's token ids are built from.

A trajectory's ids are the concatenation of segments, never a re-tokenisation of the rendered history:

    prompt   <|im_start|>system\\n{system}<|im_end|>\\n<|im_start|>user\\n{query}<|im_end|>\\n<|im_start|>assistant\\n
    sampled  {assistant text}<|im_end|>                                              (mask 1)
    tool     \\n<|im_start|>user\\n{tool response}<|im_end|>\\n<|im_start|>assistant\\n  (mask 0)

The text format itself (special tokens, how a message renders) lives in `components/models/chat_format.py`, which
the models layer also checks tokenizers against. The tokenizer is any object with `encode(text,
add_special_tokens=False) -> list[int]` and `decode(ids)`; nothing here imports torch or transformers.
"""
from __future__ import annotations

from typing import Protocol

from components.models.chat_format import (  # noqa: F401  (the text format, re-exported with the segments)
    CHAT_SPECIAL_TOKENS, GENERATION_PROMPT, IM_END, IM_START, neutralise_special_tokens, render_message, render_prompt,
)


class Tokenizer(Protocol):
    """The two methods the loop needs from a tokenizer (Hugging Face tokenizers qualify)."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


def encode(tokenizer: Tokenizer, text: str) -> list[int]:
    """Encode without the tokenizer adding BOS/EOS of its own."""
    return list(tokenizer.encode(text, add_special_tokens=False))


def prompt_ids(tokenizer: Tokenizer, messages: list[dict]) -> list[int]:
    """Token ids of the episode's opening prompt (system + user), ending with `<|im_start|>assistant\\n` (mask 0)."""
    return encode(tokenizer, render_prompt(messages))


def assistant_ids(tokenizer: Tokenizer, text: str, finished: bool = True) -> list[int]:
    """Ids of a sampled assistant turn given as text: `{text}<|im_end|>` (mask 1); no `<|im_end|>` if the turn was
    cut at the token limit, because the policy never sampled one."""
    return encode(tokenizer, text + (IM_END if finished else ""))


def tool_segment_text(observation: str) -> str:
    """The text appended after an assistant turn for a user-role observation (the env's `<tool_response>` message)."""
    return f"\n{IM_START}user\n{neutralise_special_tokens(observation)}{IM_END}\n{GENERATION_PROMPT}"


def tool_segment_ids(tokenizer: Tokenizer, observation: str) -> list[int]:
    """Ids of the observation segment (mask 0): closes the assistant turn's line, the user message, the next
    generation prompt. `observation` is the user message content as the environment returns it."""
    return encode(tokenizer, tool_segment_text(observation))


class TokenTexts:
    """The text of single token ids, cached, and where each token of a segment starts in the segment's text: what a
    marker needs to turn a character in a sampled turn back into the token that wrote it."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._pieces: dict[int, str] = {}

    def piece(self, token_id: int) -> str:
        """The text of one token (cached)."""
        text = self._pieces.get(token_id)
        if text is None:
            text = self._pieces[token_id] = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return text

    def segment(self, ids) -> tuple[str, list[int]]:
        """The text of `ids` token by token, and the character where each token starts in it."""
        pieces = [self.piece(t) for t in ids]
        offsets, position = [], 0
        for piece in pieces:
            offsets.append(position)
            position += len(piece)
        return "".join(pieces), offsets
