"""Which kind of in-context copying a model can do, measured teacher-forced on held-out copy-task records.

Two skills hide behind one copy accuracy (docs/tiny_preset.md, session 6):

- **sequential** copying (the repeat rounds, and the keys of a look-up answer): continue a list that was just read,
  token after token. Induction heads do it, and the tiny base's copy warm-up forms it (or, some runs, only halfway:
  a coined name's syllables repeat across a record, so "copy what followed this token last time" is ambiguous).
- **look-up**: after writing `Merwa ->`, find `Merwa -> F0412` among the pairs and copy `F0412`. The token before
  the value (`->`) occurs once per pair, so the key before it decides; this is what reading a tool observation or a
  retrieved passage needs (pick a row, copy its price; find the sentence about an entity, copy the answer).

- **route**: the answer of a route round (`Route: Gortu -> Palavi` for a travel request): each city is found by the
  cue word before it in the request ("starting in", "heading to"), the look-up an agent's first tool call makes.

- **recap**: the answer to a recap request (every earlier answer of the record again): copies of text hundreds of
  tokens back, the distance at which a plan copies the names its agent read early in the episode.

`probe_examples` re-masks encoded copy records so that only the tokens of one skill count; the accuracy of each is a
base_model metric (`copy_accuracy.sequential`, `.lookup_value`, `.route`, `.recap`; a skill with no tokens in the
records, such as route with `route_fraction: 0`, is left out).
"""
from __future__ import annotations

from components.training.sft import SFTExample

ARROW = "->"
SEPARATORS = (";",)
ROUTE_LEAD = "Route:"  # a route round's answer starts with it (components/synthesis/copy_task.py)
RECAP_CUE = "Recap:"  # a recap request starts with it (copy_task.RECAP)


def _text(tokenizer, token_id: int) -> str:
    return tokenizer.decode([token_id]).strip()


def trained_spans(example: SFTExample) -> list[range]:
    """The runs of consecutive trained positions (one per assistant turn)."""
    spans, start = [], None
    for index, trained in enumerate([*example.mask, 0]):
        if trained and start is None:
            start = index
        elif not trained and start is not None:
            spans.append(range(start, index))
            start = None
    return spans


def recap_spans(tokenizer, example: SFTExample) -> list[range]:
    """The trained turns that answer a recap request (the untrained text before them holds `Recap:`)."""
    spans, previous_end = [], 0
    for span in trained_spans(example):
        if RECAP_CUE in tokenizer.decode(example.input_ids[previous_end:span.start]):
            spans.append(span)
        previous_end = span.stop
    return spans


def recap_positions(tokenizer, example: SFTExample) -> set[int]:
    """Indices of the tokens of recap answers (every answer of the record again), except the end of turn."""
    return {i for span in recap_spans(tokenizer, example) for i in span
            if example.input_ids[i] != tokenizer.eos_token_id}


def route_positions(tokenizer, example: SFTExample) -> set[int]:
    """Indices of the city tokens of route answers: every token of a trained turn that starts `Route:`, except
    that lead, the arrow and the end of turn (a recap that starts with a route is a recap)."""
    positions: set[int] = set()
    recaps = recap_spans(tokenizer, example)
    for span in trained_spans(example):
        if span in recaps:
            continue
        lead = next((k for k in range(1, len(span) + 1)
                     if tokenizer.decode([example.input_ids[i] for i in span[:k]]) == ROUTE_LEAD), None)
        if lead is None:
            continue
        positions |= {i for i in span[lead:]
                      if _text(tokenizer, example.input_ids[i]) != ARROW and example.input_ids[i] != tokenizer.eos_token_id}
    return positions


def lookup_value_positions(tokenizer, example: SFTExample) -> set[int]:
    """Indices of the trained tokens that are look-up values: after an arrow token, up to the next `;` or the end
    of the assistant turn (route answers are not look-up values: see `route_positions`)."""
    positions: set[int] = set()
    in_value = False
    skipped = route_positions(tokenizer, example) | recap_positions(tokenizer, example)
    for index, (token_id, trained) in enumerate(zip(example.input_ids, example.mask)):
        if not trained or index in skipped:
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
    """{"sequential": ..., "lookup_value": ..., "route": ..., "recap": ...}: the same sequences, each masked to one
    skill's tokens
    (examples with none of a skill's tokens are left out of that skill)."""
    probes: dict[str, list[SFTExample]] = {"sequential": [], "lookup_value": [], "route": [], "recap": []}
    for example in examples:
        values = lookup_value_positions(tokenizer, example)
        routes = route_positions(tokenizer, example)
        recaps = recap_positions(tokenizer, example)
        lookup = [int(i in values) for i in range(len(example))]
        route = [int(i in routes) for i in range(len(example))]
        recap = [int(i in recaps) for i in range(len(example))]
        sequential = [int(bool(m) and i not in values and i not in routes and i not in recaps)
                      for i, m in enumerate(example.mask)]
        for kind, mask in (("lookup_value", lookup), ("sequential", sequential), ("route", route), ("recap", recap)):
            if any(mask):
                probes[kind].append(SFTExample(input_ids=example.input_ids, mask=mask))
    return probes


def copy_accuracy(model, tokenizer, examples: list[SFTExample], micro_batch_size: int) -> dict[str, float | None]:
    """Teacher-forced greedy accuracy of each copying skill on `examples` (held-out copy records)."""
    from components.training.sft import evaluate_token_accuracy

    accuracy = {}
    for kind, probe in probe_examples(tokenizer, examples).items():
        if not probe:
            continue
        value = evaluate_token_accuracy(model, probe, tokenizer.pad_token_id, micro_batch_size)
        accuracy[kind] = round(value, 4) if value is not None else None
    return accuracy
