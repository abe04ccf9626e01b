"""The tiny preset's tokenizer: a byte-level BPE trained on the pipeline's own corpus, in Qwen's chat format.

It is saved with `save_pretrained` and loaded back through `AutoTokenizer`, exactly like a Qwen tokenizer, so no
code downstream knows it is tiny. Digit runs may merge into one token (TRAINING.md: shorter sequences, fewer broken
copies of dates and ids).
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
"""Qwen's special tokens: `<|endoftext|>` pads, `<|im_start|>`/`<|im_end|>` delimit chat messages."""

PROTOCOL_TAGS = [
    "<think>", "</think>",
    "<tool_call>", "</tool_call>",
    "<answer>", "</answer>",
    "<tool_response>", "</tool_response>",
    "<tools>", "</tools>",
]
"""The agent protocol's tags: added (never split) but not special, so decoding with
`skip_special_tokens=True` keeps them, as in Qwen2.5."""

PAD_TOKEN = "<|endoftext|>"
END_OF_TURN = "<|im_end|>"

# Qwen2's pre-tokenizer pattern, except that digit runs (with an optional leading space) stay together and BPE may
# merge them, instead of one token per digit.
PRETOKENIZE_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

CHAT_TEMPLATE = (
    "{%- if messages and messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- set rest = messages[1:] %}"
    "{%- else %}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{%- set rest = messages %}"
    "{%- endif %}"
    "{%- for message in rest %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- endif %}"
)
"""Qwen2.5's chat template without its tool rendering (our system prompt already holds the tool schemas)."""


def name_piece_pattern(pieces: Sequence[str]) -> str:
    """A regex that peels the first piece off a word made only of `pieces` (case-insensitive, with the space or
    punctuation mark in front of it); words with anything else in them never match.

    Applied as a pre-tokenizer split once per extra piece, it cuts an invented name into its syllables before BPE sees
    it, so every name (seen in training or not) is the same kind of token sequence and the vocabulary holds syllables
    instead of whole memorised names.
    """
    if not pieces:
        raise ValueError("name_piece_pattern needs at least one piece")
    alternatives = "|".join(re.escape(p) for p in sorted({p.lower() for p in pieces}, key=lambda p: (-len(p), p)))
    return rf"^[^\p{{L}}\p{{N}}]?(?i:{alternatives})(?=(?i:{alternatives})+$)"


def name_prefix_pattern(pieces: Sequence[str]) -> str:
    """A regex matching the one space or punctuation mark in front of a word made only of `pieces` (split off as a
    token of its own by `build_tiny_tokenizer(detach_name_prefix=True)`)."""
    if not pieces:
        raise ValueError("name_prefix_pattern needs at least one piece")
    alternatives = "|".join(re.escape(p) for p in sorted({p.lower() for p in pieces}, key=lambda p: (-len(p), p)))
    return rf"^[^\p{{L}}\p{{N}}](?=(?i:{alternatives})+$)"


def build_tiny_tokenizer(texts: Iterable[str], vocab_size: int = 4096, min_frequency: int = 2,
                         name_pieces: Sequence[str] = (), max_name_pieces: int = 4, detach_name_prefix: bool = False):
    """Train a byte-level BPE on `texts` and wrap it as a Hugging Face fast tokenizer in Qwen's chat format.

    The vocabulary holds the 256 byte symbols, the special tokens, the protocol tags (added tokens, never split by
    BPE) and up to `vocab_size` entries in all; `<|endoftext|>` pads and `<|im_end|>` ends a turn. With
    `name_pieces` (the syllables invented names are made of), a word made only of them is split into them, for names
    of up to `max_name_pieces` syllables; with `detach_name_prefix` the space or mark in front of such a word is
    split off first (" Kamo" -> " ", "Ka", "mo"), so a name copied from a table row (where it starts a line and has
    no space) into a sentence is the same token sequence, not "Ka" there and "ĠKa" here.
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    minimum = 256 + len(SPECIAL_TOKENS) + len(PROTOCOL_TAGS)
    if vocab_size <= minimum:
        raise ValueError(f"vocab_size must exceed {minimum} (bytes + special tokens + protocol tags), got {vocab_size}")
    bpe = Tokenizer(models.BPE())
    peel = [pre_tokenizers.Split(Regex(name_piece_pattern(name_pieces)), behavior="isolated")] if name_pieces else []
    detach = ([pre_tokenizers.Split(Regex(name_prefix_pattern(name_pieces)), behavior="isolated")]
              if name_pieces and detach_name_prefix else [])
    bpe.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_PATTERN), behavior="isolated"),
        *detach,
        *peel * (max_name_pieces - 1),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(PROTOCOL_TAGS),
        min_frequency=min_frequency,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(_without_protocol_tokens(texts), trainer=trainer)
    bpe.add_tokens([AddedToken(tag, special=False, normalized=False) for tag in PROTOCOL_TAGS])
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token=END_OF_TURN,
        pad_token=PAD_TOKEN,
        chat_template=CHAT_TEMPLATE,
        padding_side="left",
        model_max_length=1 << 20,
    )


def _without_protocol_tokens(texts: Iterable[str]) -> Iterable[str]:
    """Yield the corpus with special tokens and tags removed, so BPE does not spend merges on their pieces."""
    for text in texts:
        for token in SPECIAL_TOKENS + PROTOCOL_TAGS:
            text = text.replace(token, "\n")
        yield text
