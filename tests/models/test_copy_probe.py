"""The copy probe splits a copy record's trained tokens into sequential copying and look-up values."""
import pytest

from components.models.copy_probe import lookup_value_positions, probe_examples
from components.training.sft import encode_record


@pytest.fixture(scope="module")
def copy_tokenizer():
    from components.models.tokenizer import build_tiny_tokenizer
    from components.synthesis.copy_task import CopyTaskParams, copy_records
    from components.travel.synthetic import NAME_SYLLABLES

    texts = [m["content"] for r in copy_records(CopyTaskParams(records=200, seed=5)) for m in r["messages"]]
    return build_tiny_tokenizer(texts, vocab_size=800, name_pieces=NAME_SYLLABLES)


def record(user: str, assistant: str) -> list[dict]:
    return [{"role": "system", "content": "You copy.", "train": False},
            {"role": "user", "content": user, "train": False},
            {"role": "assistant", "content": assistant, "train": True}]


def masked_text(tokenizer, example, positions) -> str:
    return tokenizer.decode([example.input_ids[i] for i in sorted(positions)])


def test_look_up_values_are_the_tokens_after_each_arrow(copy_tokenizer):
    example = encode_record(copy_tokenizer, record("Pairs: Merwa -> F0412; Kabranta -> Lune Gardens.\n"
                                                   "Look up: Kabranta, Merwa",
                                                   "Kabranta -> Lune Gardens; Merwa -> F0412"))
    values = lookup_value_positions(copy_tokenizer, example)
    assert masked_text(copy_tokenizer, example, values).split() == ["Lune", "Gardens", "F0412"]
    assert all(example.mask[i] for i in values)  # only the policy's own tokens; the pairs in the prompt never count


def test_a_repeat_round_is_all_sequential(copy_tokenizer):
    example = encode_record(copy_tokenizer, record("Repeat: Helcano, F1234, $318", "Helcano, F1234, $318"))
    probes = probe_examples(copy_tokenizer, [example])
    assert probes["lookup_value"] == [] and probes["sequential"][0].mask == example.mask


def test_the_two_probes_partition_the_trained_tokens(copy_tokenizer):
    from components.synthesis.copy_task import CopyTaskParams, copy_records

    for rec in copy_records(CopyTaskParams(records=20, repeat_fraction=0.5, seed=2)):
        example = encode_record(copy_tokenizer, rec["messages"])
        values = lookup_value_positions(copy_tokenizer, example)
        sequential = {i for i, m in enumerate(example.mask) if m} - values
        assert values | sequential == {i for i, m in enumerate(example.mask) if m} and not values & sequential


def test_a_route_answer_counts_its_two_cities_and_nothing_else(copy_tokenizer):
    from components.models.copy_probe import route_positions

    example = encode_record(copy_tokenizer, record(
        "Can you put together a 3-day trip starting in Gortu and visiting Palavi between March 5th, 2022 and "
        "March 7th, 2022?", "Route: Gortu -> Palavi"))
    routes = route_positions(copy_tokenizer, example)
    assert masked_text(copy_tokenizer, example, routes).split() == ["Gortu", "Palavi"]
    probes = probe_examples(copy_tokenizer, [example])
    assert probes["lookup_value"] == []  # the destination after the arrow is a route city, not a look-up value
    assert masked_text(copy_tokenizer, example, [i for i, m in enumerate(probes["sequential"][0].mask) if m]) \
        == "Route: -><|im_end|>"


def test_a_fact_answer_counts_its_value_and_nothing_else(copy_tokenizer):
    from components.models.copy_probe import fact_positions

    example = encode_record(copy_tokenizer, record(
        "Doc 1(Title: Belthal Waash) Belthal Waash was born in Mirathal. The profession of Belthal Waash was chemist.\n"
        "Question: Where was Belthal Waash born?", "Answer: Mirathal"))
    facts = fact_positions(copy_tokenizer, example)
    assert masked_text(copy_tokenizer, example, facts).strip() == "Mirathal"
    probes = probe_examples(copy_tokenizer, [example])
    assert len(probes["fact"]) == 1 and probes["lookup_value"] == [] and probes["route"] == []
    assert masked_text(copy_tokenizer, example, [i for i, m in enumerate(probes["sequential"][0].mask) if m]) \
        == "Answer:<|im_end|>"


def test_the_three_probes_partition_the_trained_tokens_of_records_with_routes(copy_tokenizer):
    from components.models.copy_probe import route_positions
    from components.synthesis.copy_task import CopyTaskParams, copy_records

    counts = {"route": 0, "lookup_value": 0}
    for rec in copy_records(CopyTaskParams(records=20, repeat_fraction=0.5, route_fraction=0.3, seed=2)):
        example = encode_record(copy_tokenizer, rec["messages"])
        values, routes = lookup_value_positions(copy_tokenizer, example), route_positions(copy_tokenizer, example)
        trained = {i for i, m in enumerate(example.mask) if m}
        assert not values & routes and values | routes <= trained
        counts["route"] += len(routes)
        counts["lookup_value"] += len(values)
    assert counts["route"] > 0 and counts["lookup_value"] > 0


def test_a_recap_answer_is_its_own_skill_even_when_it_starts_with_a_route(copy_tokenizer):
    from components.models.copy_probe import recap_positions, route_positions
    from components.synthesis.copy_task import RECAP

    messages = record("Can you put together a 3-day trip starting in Gortu and visiting Palavi?", "Route: Gortu -> Palavi")
    messages += [{"role": "user", "content": "Repeat: Helcano, F1234", "train": False},
                 {"role": "assistant", "content": "Helcano, F1234", "train": True},
                 {"role": "user", "content": RECAP, "train": False},
                 {"role": "assistant", "content": "Route: Gortu -> Palavi | Helcano, F1234", "train": True}]
    example = encode_record(copy_tokenizer, messages)
    recaps = recap_positions(copy_tokenizer, example)
    assert masked_text(copy_tokenizer, example, recaps) == "Route: Gortu -> Palavi | Helcano, F1234"
    assert masked_text(copy_tokenizer, example, route_positions(copy_tokenizer, example)).split() == ["Gortu", "Palavi"]
    probes = probe_examples(copy_tokenizer, [example])
    assert probes["lookup_value"] == [] and len(probes["recap"]) == 1
    sequential = {i for i, m in enumerate(probes["sequential"][0].mask) if m}
    assert not sequential & recaps and masked_text(copy_tokenizer, example, sequential).startswith("Route: ->")


def test_copies_are_bucketed_by_how_far_back_their_source_is():
    from components.models.copy_probe import copy_accuracy_by_distance, distance_examples
    from components.training.sft import SFTExample

    filler = list(range(100, 480))  # 380 distinct tokens
    # a name (7, 8, 9) read at the start, copied right after the filler (distance ~380) and again 50 tokens later
    ids = [7, 8, 9] + filler + [7, 8, 9] + list(range(500, 550)) + [7, 8, 9]
    mask = [0] * (3 + len(filler)) + [1] * 3 + [0] * 50 + [1] * 3
    template = SFTExample(input_ids=[1, 2, 3], mask=[0, 1, 1])
    probes = distance_examples([SFTExample(ids, mask)] + [template] * 9, edges=(100, 300))
    marked = {label: [i for e in p for i, m in enumerate(e.mask) if m] for label, p in probes.items()}
    first, second = 3 + len(filler), 3 + len(filler) + 3 + 50
    assert marked == {"<100": [second + 1, second + 2], "100-300": [], ">=300": [first + 1, first + 2]}
    # the bigram (1, 2) is in every example: the format's own text, never counted as a copy
    assert all(e.input_ids != [1, 2, 3] for p in probes.values() for e in p)


def test_copy_accuracy_by_distance_reports_tokens_and_accuracy_per_bucket(tiny_model):
    from components.models.copy_probe import copy_accuracy_by_distance
    from components.training.sft import SFTExample

    ids = [5, 6, 7] + list(range(10, 40)) + [5, 6, 7]
    example = SFTExample(ids, [0] * 33 + [1] * 3)
    result = copy_accuracy_by_distance(tiny_model, [example], pad_id=0, micro_batch_size=2, edges=(100,))
    assert result[">=100"] == {"tokens": 0, "accuracy": None}
    assert result["<100"]["tokens"] == 2 and 0.0 <= result["<100"]["accuracy"] <= 1.0


def test_the_report_sets_short_and_episode_long_copy_records_side_by_side(tiny_model, tiny_tokenizer, conversations):
    from components.models.copy_probe import copy_probe_report, format_report
    from components.synthesis.copy_task import CopyTaskParams

    params = CopyTaskParams(rounds=(2, 3), items=(3, 4), recap_rounds=(6, 8), seed=3)
    records = [{"messages": messages} for messages in conversations[:3]]
    report = copy_probe_report(tiny_model, tiny_tokenizer, params, records, examples=3, micro_batch_size=2)
    assert set(report) == {"short", "long", "records"}
    assert report["short"]["examples"] == report["long"]["examples"] == 3
    assert report["long"]["median_tokens"] > 2 * report["short"]["median_tokens"]  # recaps: an episode's length
    assert "recap" in report["long"]["copy_accuracy"] and "recap" not in report["short"]["copy_accuracy"]
    assert set(report["long"]["by_distance"]) == {"<100", "100-300", "300-700", ">=700"}
    assert report["records"]["examples"] == 3
    assert report["records"]["names"]["names"] == 0  # these episodes search flights only: no listing name to copy
    text = format_report(report)
    assert text.count("\n") == 2 and "copies by distance back" in text and "short: 3 examples" in text


def test_the_probe_draws_fresh_records_not_the_training_ones():
    from components.models.copy_probe import PROBE_SEED_OFFSET
    from components.synthesis.copy_task import CopyTaskParams, copy_records

    params = CopyTaskParams(records=5, seed=0)
    training = copy_records(params)
    probed = copy_records(params.model_copy(update={"seed": params.seed + PROBE_SEED_OFFSET}))
    assert [r["messages"] for r in training] != [r["messages"] for r in probed]


@pytest.fixture(scope="module")
def saved_tiny(tiny_model, tiny_tokenizer, tmp_path_factory):
    from components.models.checkpoints import save_checkpoint

    return save_checkpoint(tiny_model, tiny_tokenizer, tmp_path_factory.mktemp("probe_model"), stage="test")


@pytest.fixture
def probe_params(tmp_path):
    path = tmp_path / "model.yaml"
    path.write_text("model:\n  pretrain_copy:\n    rounds: [2, 3]\n    items: [3, 4]\n    recap_rounds: [5, 6]\n")
    return path


def test_star_copy_probe_prints_the_report_and_writes_it_as_json(saved_tiny, probe_params, conversations, tmp_path,
                                                                  capsys):
    import json

    from components.cli import main

    records = tmp_path / "eval.jsonl"
    records.write_text("".join(json.dumps({"messages": c}) + "\n" for c in conversations[:2]))
    out = tmp_path / "probe.json"
    assert main(["copy-probe", "--model", str(saved_tiny), "--params", str(probe_params), "--records", str(records),
                 "--examples", "2", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("short: 2 examples") and "long: 2 examples" in printed and "records: 2 examples" in printed
    report = json.loads(out.read_text())
    assert report["model"] == str(saved_tiny) and report["records"]["examples"] == 2


@pytest.mark.parametrize("problem", ["not a checkpoint", "not chat records", "no examples"])
def test_star_copy_probe_says_what_is_wrong_with_its_inputs(saved_tiny, probe_params, tmp_path, capsys, problem):
    from components.cli import main

    records = tmp_path / "plans.jsonl"
    records.write_text('{"plan": []}\n')
    model = tmp_path if problem == "not a checkpoint" else saved_tiny
    args = ["copy-probe", "--model", str(model), "--params", str(probe_params),
            "--examples", "0" if problem == "no examples" else "2"]
    if problem == "not chat records":
        args += ["--records", str(records)]
    assert main(args) == 2
    error = capsys.readouterr().err
    expected = {"not a checkpoint": "no config.json", "not chat records": "plans.jsonl:1: not a chat record",
                "no examples": "--examples must be at least 1"}[problem]
    assert expected in error
