"""Which kind of in-context copying a model can do, measured teacher-forced on held-out copy-task records.

Two skills hide behind one copy accuracy (docs/tiny_preset.md, session 6):

- **sequential** copying (the repeat rounds, and the keys of a look-up answer): continue a list that was just read,
  token after token. Induction heads do it, and the tiny base's copy warm-up forms it (or, some runs, only halfway:
  a coined name's syllables repeat across a record, so "copy what followed this token last time" is ambiguous).
- **look-up**: after writing `Merwa ->`, find `Merwa -> F0412` among the pairs and copy `F0412`. The token before
  the value (`->`) occurs once per pair, so the key before it decides; this is what reading a tool observation or a
  retrieved passage needs (pick a row, copy its price; find the sentence about an entity, copy the answer).

`probe_examples` re-masks encoded copy records so that only the tokens of one skill count; the accuracy of each is a
base_model metric (`copy_accuracy.sequential`, `copy_accuracy.lookup_value`).
"""
from __future__ import annotations

from components.training.sft import SFTExample

ARROW = "->"
SEPARATORS = (";",)


def _text(tokenizer, token_id: int) -> str:
    return tokenizer.decode([token_id]).strip()


def lookup_value_positions(tokenizer, example: SFTExample) -> set[int]:
    """Indices of the trained tokens that are look-up values: after an arrow token, up to the next `;` or the end
    of the assistant turn."""
    positions: set[int] = set()
    in_value = False
    for index, (token_id, trained) in enumerate(zip(example.input_ids, example.mask)):
        if not trained:
            in_value = False
            continue
        text = _text(tokenizer, token_id)
        if text == ARROW:
            in_value = True
            continue
        if text in SEPARATORS or token_id == tokenizer.eos_token_id:
            in_value = False
            continue
        if in_value:
            positions.add(index)
    return positions


def probe_examples(tokenizer, examples: list[SFTExample]) -> dict[str, list[SFTExample]]:
    """{"sequential": ..., "lookup_value": ...}: the same sequences, each masked to one skill's tokens (examples with
    none of a skill's tokens are left out of that skill)."""
    probes: dict[str, list[SFTExample]] = {"sequential": [], "lookup_value": []}
    for example in examples:
        values = lookup_value_positions(tokenizer, example)
        lookup = [int(i in values) for i in range(len(example))]
        sequential = [int(bool(m) and i not in values) for i, m in enumerate(example.mask)]
        for kind, mask in (("lookup_value", lookup), ("sequential", sequential)):
            if any(mask):
                probes[kind].append(SFTExample(input_ids=example.input_ids, mask=mask))
    return probes


def copy_accuracy(model, tokenizer, examples: list[SFTExample], micro_batch_size: int) -> dict[str, float | None]:
    """Teacher-forced greedy accuracy of each copying skill on `examples` (held-out copy records)."""
    from components.training.sft import evaluate_token_accuracy

    accuracy = {}
    for kind, probe in probe_examples(tokenizer, examples).items():
        value = evaluate_token_accuracy(model, probe, tokenizer.pad_token_id, micro_batch_size)
        accuracy[kind] = round(value, 4) if value is not None else None
    return accuracy
