"""The tiny tokenizer: protocol strings survive a round trip, tags are single tokens, and the chat template renders
exactly the ids the agent loop builds from segments."""
from __future__ import annotations

import json

import pytest

from components.agent import tokens
from components.models.tokenizer import PROTOCOL_TAGS, SPECIAL_TOKENS


def test_every_tag_and_special_token_is_one_token(tiny_tokenizer):
    for tag in PROTOCOL_TAGS + SPECIAL_TOKENS:
        assert tiny_tokenizer.encode(tag, add_special_tokens=False) == [tiny_tokenizer.convert_tokens_to_ids(tag)]


def test_protocol_strings_round_trip(tiny_tokenizer, conversations):
    from components.travel.protocol import PLAN_EXAMPLE, tool_response

    samples = [m["content"] for m in conversations[0]]
    samples += [json.dumps(PLAN_EXAMPLE), tool_response("Ünïcödé café → 東京, 7 km\n\ttabs"), " leading space",
                "<think></think><answer>-</answer>", "2022-03-16 F3633413 $1,433"]
    for text in samples:
        ids = tiny_tokenizer.encode(text, add_special_tokens=False)
        assert tiny_tokenizer.decode(ids) == text


def test_tags_are_kept_when_special_tokens_are_skipped(tiny_tokenizer):
    ids = tiny_tokenizer.encode("<think>go</think><tool_call>{}</tool_call><|im_end|>", add_special_tokens=False)
    assert tiny_tokenizer.decode(ids, skip_special_tokens=True) == "<think>go</think><tool_call>{}</tool_call>"


def test_digit_runs_merge_into_few_tokens(tiny_tokenizer):
    # Qwen splits every digit; ours lets BPE merge runs seen in the corpus (shorter, easier-to-copy dates and ids).
    assert len(tiny_tokenizer.encode("2022", add_special_tokens=False)) == 1
    assert len(tiny_tokenizer.encode("2022-03-16", add_special_tokens=False)) < 10


def test_pad_and_end_of_turn_tokens(tiny_tokenizer):
    assert tiny_tokenizer.eos_token == "<|im_end|>"
    assert tiny_tokenizer.pad_token == "<|endoftext|>"
    assert tiny_tokenizer.padding_side == "left"


def _template_ids(tokenizer, messages, add_generation_prompt):
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    return tokenizer.encode(rendered, add_special_tokens=False)


def test_chat_template_matches_the_loop_segments(tiny_tokenizer, conversations):
    system, user, call, observation, answer = conversations[3]
    loop_ids = (tokens.prompt_ids(tiny_tokenizer, [system, user])
                + tokens.assistant_ids(tiny_tokenizer, call["content"])
                + tokens.tool_segment_ids(tiny_tokenizer, observation["content"]))
    # Mid-episode, the context ends with the generation prompt: both give the same ids.
    assert _template_ids(tiny_tokenizer, [system, user, call, observation], True) == loop_ids
    # A finished episode: the template adds only the newline after the last <|im_end|>.
    finished = loop_ids + tokens.assistant_ids(tiny_tokenizer, answer["content"])
    assert _template_ids(tiny_tokenizer, conversations[3], False) == finished + tiny_tokenizer.encode("\n")


def test_apply_chat_template_tokenize_gives_the_same_ids(tiny_tokenizer, conversations):
    encoded = tiny_tokenizer.apply_chat_template(conversations[1][:2], add_generation_prompt=True, tokenize=True)
    ids = encoded["input_ids"] if hasattr(encoded, "keys") else encoded
    assert list(ids) == tokens.prompt_ids(tiny_tokenizer, conversations[1][:2])


def test_saved_tokenizer_loads_back_identically(tiny_tokenizer, conversations, tmp_path):
    from components.models.loading import load_tokenizer

    tiny_tokenizer.save_pretrained(tmp_path)
    loaded = load_tokenizer(tmp_path)
    text = tokens.render_prompt(conversations[2][:2])
    assert loaded.encode(text, add_special_tokens=False) == tiny_tokenizer.encode(text, add_special_tokens=False)
    assert loaded.apply_chat_template(conversations[2], tokenize=False) == \
        tiny_tokenizer.apply_chat_template(conversations[2], tokenize=False)


def test_a_checkpoint_directory_reads_text_as_the_model_was_trained(tiny_tokenizer, tmp_path):
    # Regression: with a qwen2 config.json beside it, AutoTokenizer rebuilds the tokenizer as Qwen2Tokenizer, whose
    # pre-tokenizer splits every digit; the tiny model was trained on merged digit runs.
    from transformers import Qwen2Config

    from components.models.loading import load_tokenizer

    tiny_tokenizer.save_pretrained(tmp_path)
    Qwen2Config(vocab_size=len(tiny_tokenizer), hidden_size=8, num_hidden_layers=1, num_attention_heads=1,
                num_key_value_heads=1, intermediate_size=8).save_pretrained(tmp_path)
    text = "Flight F3600097 on 2022-03-16 costs $1,400; 7 hours 50 mins, 693 km."
    assert load_tokenizer(tmp_path).encode(text, add_special_tokens=False) == \
        tiny_tokenizer.encode(text, add_special_tokens=False)


def test_invented_names_split_into_their_syllables_seen_or_not():
    from components.models.tokenizer import build_tiny_tokenizer
    from components.travel.synthetic import NAME_SYLLABLES

    corpus = ['Fly from Norlafen to "Patuwa" on 2022-03-16; Sala House costs $158 in Ithaca.'] * 20
    tokenizer = build_tiny_tokenizer(corpus, vocab_size=600, name_pieces=NAME_SYLLABLES)
    assert tokenizer.tokenize(" Norlafen") == ["ĠNor", "la", "fen"]  # seen: still syllables, never one whole token
    # Never in the corpus: cut at the same syllable boundaries before BPE, so no token spans two syllables.
    pieces = tokenizer.backend_tokenizer.pre_tokenizer.pre_tokenize_str(" Lafenpatu")
    assert [piece for piece, _ in pieces] == ["ĠLa", "fen", "pa", "tu"]
    assert tokenizer.tokenize(" Ithaca") == ["ĠIthaca"]  # not made of syllables: BPE as usual


def test_a_name_is_the_same_tokens_in_a_table_row_and_in_a_sentence():
    """A listing's name starts its table row (no space before it); the think that picks it writes it after a space.
    With the prefix detached, copying the name is copying the same token ids (without it, "Ka" there, "ĠKa" here)."""
    from components.models.tokenizer import build_tiny_tokenizer
    from components.travel.synthetic import NAME_SYLLABLES

    corpus = ["NAME\tprice\nKamo Loft\t530\nPalodro Retreat\t376\n", "I pick Kamo Loft ($530/night)."] * 20
    detached = build_tiny_tokenizer(corpus, vocab_size=600, name_pieces=NAME_SYLLABLES, detach_name_prefix=True)
    attached = build_tiny_tokenizer(corpus, vocab_size=600, name_pieces=NAME_SYLLABLES)
    row, sentence = "\nKamo Loft\t530", "; I pick Kamo Loft ($530"
    in_row, in_sentence = detached.tokenize(row), detached.tokenize(sentence)
    start = in_sentence.index("Ka")
    assert in_row[1:4] == in_sentence[start:start + 3] == ["Ka", "mo", "ĠLoft"]
    assert in_sentence[start - 1] == "Ġ"
    assert attached.tokenize(row)[1] == "Ka" and "ĠKa" in attached.tokenize(sentence)  # the mismatch it fixes
    pieces = detached.backend_tokenizer.pre_tokenizer.pre_tokenize_str(" Ithaca pick Kamo")
    assert [piece for piece, _ in pieces] == ["ĠIthaca", "Ġpick", "Ġ", "Ka", "mo"]  # other words keep their space
    for text in (row, sentence, " Norlafen, Patuwa"):
        assert detached.decode(detached(text)["input_ids"]) == text


def test_name_piece_pattern_peels_only_words_made_of_pieces():
    import re

    from components.models.tokenizer import name_piece_pattern

    pattern = name_piece_pattern(["nor", "no", "la", "fen"])
    assert re.match(pattern.replace("\\p{L}\\p{N}", "\\w"), " Norlafen").group(0) == " Nor"  # backtracks: not "No"
    assert re.match(pattern.replace("\\p{L}\\p{N}", "\\w"), " Norlafenx") is None
    with pytest.raises(ValueError):
        name_piece_pattern([])


def test_vocab_size_must_leave_room_for_merges():
    from components.models.tokenizer import build_tiny_tokenizer

    with pytest.raises(ValueError, match="vocab_size"):
        build_tiny_tokenizer(["hello"], vocab_size=100)
