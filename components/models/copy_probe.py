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

- **fact**: the answer of a fact round (`Answer: Mirathal` for three encyclopedia passages and a question): find
  the sentence about the question's entity, copy its value, the look-up a QA episode makes.

- **recap**: the answer to a recap request (every earlier answer of the record again): copies of text hundreds of
  tokens back, the distance at which a plan copies the names its agent read early in the episode.

`probe_examples` re-masks encoded copy records so that only the tokens of one skill count; the accuracy of each is a
base_model metric (`copy_accuracy.sequential`, `.lookup_value`, `.route`, `.fact`, `.recap`; a skill with no tokens in the
records, such as route with `route_fraction: 0`, is left out).
"""
from __future__ import annotations

from components.training.sft import SFTExample

ARROW = "->"
SEPARATORS = (";",)
ROUTE_LEAD = "Route:"  # a route round's answer starts with it (components/synthesis/copy_task.py)
FACT_LEAD = "Answer:"  # a fact round's answer starts with it (copy_task.FACT_LEAD)
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


def lead_positions(tokenizer, example: SFTExample, lead: str) -> set[int]:
    """Indices of the answer tokens of the trained turns that start with `lead`: every token after the lead, except
    arrows and the end of turn (a recap that starts with such an answer is a recap)."""
    positions: set[int] = set()
    recaps = recap_spans(tokenizer, example)
    for span in trained_spans(example):
        if span in recaps:
            continue
        end = next((k for k in range(1, len(span) + 1)
                    if tokenizer.decode([example.input_ids[i] for i in span[:k]]) == lead), None)
        if end is None:
            continue
        positions |= {i for i in span[end:]
                      if _text(tokenizer, example.input_ids[i]) != ARROW and example.input_ids[i] != tokenizer.eos_token_id}
    return positions


def route_positions(tokenizer, example: SFTExample) -> set[int]:
    """Indices of the city tokens of route answers (trained turns that start `Route:`)."""
    return lead_positions(tokenizer, example, ROUTE_LEAD)


def fact_positions(tokenizer, example: SFTExample) -> set[int]:
    """Indices of the value tokens of fact answers (trained turns that start `Answer:`)."""
    return lead_positions(tokenizer, example, FACT_LEAD)


def lookup_value_positions(tokenizer, example: SFTExample) -> set[int]:
    """Indices of the trained tokens that are look-up values: after an arrow token, up to the next `;` or the end
    of the assistant turn (route answers are not look-up values: see `route_positions`)."""
    positions: set[int] = set()
    in_value = False
    skipped = (route_positions(tokenizer, example) | fact_positions(tokenizer, example)
               | recap_positions(tokenizer, example))
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
    """{"sequential": ..., "lookup_value": ..., "route": ..., "fact": ..., "recap": ...}: the same sequences, each
    masked to one skill's tokens (examples with none of a skill's tokens are left out of that skill)."""
    probes: dict[str, list[SFTExample]] = {"sequential": [], "lookup_value": [], "route": [], "fact": [],
                                           "recap": []}
    for example in examples:
        skills = {"lookup_value": lookup_value_positions(tokenizer, example),
                  "route": route_positions(tokenizer, example), "fact": fact_positions(tokenizer, example),
                  "recap": recap_positions(tokenizer, example)}
        claimed = set().union(*skills.values())
        skills["sequential"] = {i for i, m in enumerate(example.mask) if m and i not in claimed}
        for kind, positions in skills.items():
            if positions:
                mask = [int(i in positions) for i in range(len(example))]
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


# ---- copying by distance (any model, any trajectories) ----------------------------------------------------------

DISTANCE_BUCKETS = (100, 300, 700)
"""Edges (in tokens) of the distance buckets: <100, 100-300, 300-700, >=700."""


def _bucket(distance: int, edges: tuple[int, ...]) -> str:
    lower = 0
    for edge in edges:
        if distance < edge:
            return f"<{edge}" if lower == 0 else f"{lower}-{edge}"
        lower = edge
    return f">={lower}"


def common_bigrams(examples: list[SFTExample], share: float) -> set[tuple[int, int]]:
    """Token bigrams found in at least `share` of the examples (and in two at least): the format's own text (keys,
    tags, phrases), which a model predicts from memory, not by copying."""
    counts: dict[tuple[int, int], int] = {}
    for example in examples:
        for bigram in set(zip(example.input_ids, example.input_ids[1:])):
            counts[bigram] = counts.get(bigram, 0) + 1
    return {bigram for bigram, count in counts.items() if count >= max(2, share * len(examples))}


def distance_examples(examples: list[SFTExample], edges: tuple[int, ...] = DISTANCE_BUCKETS,
                      common_share: float = 0.05) -> dict[str, list[SFTExample]]:
    """The trained tokens that copy earlier context, masked by how far back the copy's source is.

    A trained token copies when its bigram (previous token, token) occurred earlier in the same sequence and is not
    one of the `common_bigrams` (in invented-name worlds those are names, ids and prices read earlier in the
    episode); its distance is to the nearest earlier occurrence."""
    common = common_bigrams(examples, common_share)
    labels = [_bucket(edge - 1, edges) for edge in edges] + [_bucket(edges[-1], edges)]
    probes: dict[str, list[SFTExample]] = {label: [] for label in labels}
    for example in examples:
        ids, last_seen = example.input_ids, {}
        masks = {label: [0] * len(ids) for label in labels}
        for i in range(1, len(ids)):
            bigram = (ids[i - 1], ids[i])
            if example.mask[i] and bigram not in common and bigram in last_seen:
                masks[_bucket(i - last_seen[bigram], edges)][i] = 1
            last_seen[bigram] = i
        for label, mask in masks.items():
            if any(mask):
                probes[label].append(SFTExample(input_ids=ids, mask=mask))
    return probes


def copy_accuracy_by_distance(model, examples: list[SFTExample], pad_id: int, micro_batch_size: int,
                              edges: tuple[int, ...] = DISTANCE_BUCKETS) -> dict[str, dict]:
    """{bucket: {"tokens": n, "accuracy": teacher-forced greedy accuracy}} of the copied tokens of `examples`
    (`distance_examples`). A tiny SFT checkpoint: 90% of copies from under 100 tokens back, 79% from 100-300, 32%
    from 300-700 (and ~1% of the name syllables in its plans copied from 300+ back; docs/tiny_preset.md, session 7)."""
    from components.training.sft import evaluate_token_accuracy

    result = {}
    for label, probe in distance_examples(examples, edges).items():
        accuracy = evaluate_token_accuracy(model, probe, pad_id, micro_batch_size) if probe else None
        result[label] = {"tokens": sum(sum(e.mask) for e in probe),
                         "accuracy": round(accuracy, 4) if accuracy is not None else None}
    return result


# ---- the probe report (`star copy-probe`): short and long sequences side by side ------------------------------

PROBE_SEED_OFFSET = 7919
"""Probe records are drawn with the copy task's seed plus this offset: fresh values, never the training records."""


def median_length(examples: list[SFTExample]) -> int | None:
    """The median token count of `examples` (None when there are none)."""
    lengths = sorted(len(example) for example in examples)
    return lengths[len(lengths) // 2] if lengths else None


def copy_probe_report(model, tokenizer, copy_params, records: list[dict] | None = None, examples: int = 48,
                      micro_batch_size: int = 4, cutoff_len: int = 8192) -> dict:
    """How well `model` copies in short sequences and in long ones (teacher-forced).

    - `short`: `examples` fresh copy records as the warm-up draws them (3-6 rounds, a few hundred tokens): the
      skills of `copy_accuracy`.
    - `long`: as many records of `copy_params.recap_rounds` rounds ending with a recap (1,000-2,000 tokens, an
      episode's length): the same skills plus `copy_accuracy_by_distance`. A base pre-trained only on short
      sequences copies far worse here, even from a few tokens back (docs/tiny_preset.md, session 8).
    - `records` (optional, e.g. held-out SFT records): `copy_accuracy_by_distance` and the listing names' copying by
      part (`components.models.name_copy`) on the first `examples`.
    """
    from components.synthesis.copy_task import copy_records
    from components.training.sft import build_examples

    seed = copy_params.seed + PROBE_SEED_OFFSET
    report = {}
    for name, recap in (("short", 0.0), ("long", 1.0)):
        drawn = copy_records(copy_params.model_copy(update={"records": examples, "recap_fraction": recap,
                                                            "seed": seed}))
        encoded, _ = build_examples(tokenizer, drawn, cutoff_len, "drop", source=f"{name} copy records")
        report[name] = {"examples": len(encoded), "median_tokens": median_length(encoded),
                        "copy_accuracy": copy_accuracy(model, tokenizer, encoded, micro_batch_size)}
        if recap:
            report[name]["by_distance"] = copy_accuracy_by_distance(model, encoded, tokenizer.pad_token_id,
                                                                    micro_batch_size)
    if records:
        from components.models.name_copy import name_copy_accuracy

        encoded, _ = build_examples(tokenizer, records[:examples], cutoff_len, "drop", source="probe records")
        report["records"] = {"examples": len(encoded), "median_tokens": median_length(encoded),
                             "by_distance": copy_accuracy_by_distance(model, encoded, tokenizer.pad_token_id,
                                                                      micro_batch_size),
                             "names": name_copy_accuracy(model, tokenizer, records[:examples], max_tokens=cutoff_len)}
    return report


def name_parts(scores: dict) -> str:
    """`score_copied_names` output as "first 28.7%, middle 39.5%, last word 16.6%, whole 6.4%"."""
    return ", ".join(f"{k.replace('_', ' ')} {percent(scores[k]['accuracy'])}"
                     for k in ("first", "middle", "last_word", "whole"))


def percent(value) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def format_report(report: dict) -> str:
    """The report as a few readable lines (percentages)."""
    lines = []
    for name, part in report.items():
        head = f"{name}: {part['examples']} examples, median {part['median_tokens']} tokens"
        skills = ", ".join(f"{k} {percent(v)}" for k, v in part.get("copy_accuracy", {}).items())
        distance = ", ".join(f"{k} {percent(v['accuracy'])}" for k, v in part.get("by_distance", {}).items())
        names = part.get("names") or {}
        copied = names.get("names") and name_parts(names)
        lookup = names.get("lookup") or {}
        looked_up = lookup.get("names") and name_parts(lookup)
        lines.append("; ".join(x for x in (head, skills, distance and f"copies by distance back: {distance}",
                                           copied and f"{names['names']} listing names copied: {copied}",
                                           looked_up and f"first copies from a tool result ({lookup['names']}): "
                                                         f"{looked_up}") if x))
    return "\n".join(lines)
