"""scripts/policy_drift.py: where a trained checkpoint's sampling moved from its reference, token by token."""
import copy
import importlib.util
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[3]


def load_script():
    spec = importlib.util.spec_from_file_location("policy_drift", REPO / "scripts/policy_drift.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def record(idx: int, turns: list[tuple[str, str]]) -> dict:
    """A trajectory record: the prompt, then each (turn kind, assistant text) followed by a tool response."""
    messages = [{"role": "system", "content": "You plan trips."}, {"role": "user", "content": "3 days in Austin"}]
    for _, text in turns:
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "<tool_response>ok"}]
    return {"idx": idx, "messages": messages[:-1], "turns": [{"kind": kind} for kind, _ in turns]}


@pytest.fixture(scope="module")
def models(small_model_factory):
    return small_model_factory(seed=0).eval(), small_model_factory(seed=1).eval()


def test_a_checkpoint_against_itself_has_not_moved(models, smol_tokenizer):
    script = load_script()
    run, _ = models
    records = [record(0, [("tool", '{"tool": "FlightSearch"}'), ("protocol_error", "no tags here")])]
    sums, breaks, risen = script.drift(run, copy.deepcopy(run), smol_tokenizer, records)
    assert set(sums) == {"tool", "protocol_error"}
    for row in sums.values():
        assert row["log_ratio"] == 0 and row["rose"] == 0 and row["fell"] == 0
        assert row["run_entropy"] == pytest.approx(row["ref_entropy"])
    assert breaks == [{"idx": 0, "tokens": sums["protocol_error"]["tokens"], "first_big_rise": None,
                       "max_log_ratio": 0.0}] and not risen
    assert script.weight_change(run, copy.deepcopy(run), 5e-5)["rms_change_in_lr"] == 0


def test_a_turns_log_ratio_is_of_the_tokens_it_sampled_given_what_came_before(models, smol_tokenizer):
    """A one-token turn: its log-ratio is log pi_run(token | prefix) - log pi_ref(token | prefix), read here from
    each model's next-token distribution after the prefix alone."""
    script = load_script()
    run, reference = models
    token = smol_tokenizer.encode("Hello", add_special_tokens=False)[0]
    text = smol_tokenizer.decode([token])
    rec = record(3, [("protocol_error", text)])
    ids, spans = script.turn_spans(smol_tokenizer, rec)
    [(kind, start, end)] = spans
    assert kind == "protocol_error" and end - start == 2  # the token and <|im_end|>

    def next_logp(model, at: int) -> float:
        """log pi(ids[at] | ids[:at]), from the model's last position after the prefix alone."""
        with torch.no_grad():
            return float(torch.log_softmax(model(torch.tensor([ids[:at]])).logits[0, -1].float(), -1)[ids[at]])

    expected = [next_logp(run, at) - next_logp(reference, at) for at in (start, start + 1)]
    sums, breaks, risen = script.drift(run, reference, smol_tokenizer, [rec])
    assert sums["protocol_error"]["tokens"] == 2
    assert sums["protocol_error"]["log_ratio"] == pytest.approx(sum(expected), abs=1e-4)
    assert sums["protocol_error"]["rose"] == sum(value > script.BIG for value in expected)
    big = [position for position, value in enumerate(expected) if value > script.BIG]
    assert breaks == [{"idx": 3, "tokens": 2, "first_big_rise": big[0] if big else None,
                       "max_log_ratio": pytest.approx(max(expected), abs=1e-4)}]
    assert sum(risen.values()) == len(big)


def test_the_weight_change_is_read_in_learning_rates(models):
    script = load_script()
    run, _ = models
    reference = copy.deepcopy(run)
    with torch.no_grad():
        dict(reference.named_parameters())["model.norm.weight"].sub_(3 * 5e-5)  # 3 learning rates on every weight
    change = script.weight_change(run, reference, 5e-5)
    assert change["largest"][0] == {"tensor": "model.norm.weight", "rms_change_in_lr": pytest.approx(3, rel=1e-3)}
    share = run.model.norm.weight.numel() / change["weights"]
    assert change["rms_change_in_lr"] == pytest.approx(3 * share ** 0.5, rel=1e-3)


def test_records_that_are_missing_or_empty_are_refused_with_how_to_write_them(tmp_path):
    script = load_script()
    with pytest.raises(SystemExit, match="star rollout --out"):
        script.read_records(tmp_path / "none.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(SystemExit, match="no records"):
        script.read_records(tmp_path / "empty.jsonl")
