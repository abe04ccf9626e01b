"""The real vLLM rollout engine on CPU (components/agent/engine_server.py in .venv-engine), against the transformers
backend and the trainer: the same turns, the same log-probabilities, the same greedy tokens after an RL update and
a weight sync, for a tied (Llama) and an untied (Qwen2) model; a stage connects to the engine it prestarted; and no
engine outlives a SIGKILLed stage, nor one the stage never asked for.

Each model's engine starts once per test session (15-25 s each on 2 cores). Skipped where this checkout has no
engine environment (`./scripts/bootstrap.sh` builds .venv-engine).
"""
from __future__ import annotations

import copy
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.integration

# head_dim 64: a head size vLLM's CPU attention kernels serve
SIZES = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
             intermediate_size=256)
MAX_TOKENS = 24


def chat_prompt(tokenizer, text: str) -> list[int]:
    ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


PROMPTS = ("plan a trip to Austin", "which flights leave Dallas", "hello", "a 3-day budget trip for two")


def tied_llama(tokenizer):
    from components.models.factory import small_llama

    return small_llama(tokenizer, seed=1, hidden_size=SIZES["hidden_size"], num_layers=SIZES["num_hidden_layers"],
                       num_heads=SIZES["num_attention_heads"], num_kv_heads=SIZES["num_key_value_heads"],
                       intermediate_size=SIZES["intermediate_size"])


def untied_qwen2(tokenizer):
    from transformers import Qwen2Config

    from components.models.factory import random_model

    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    config = Qwen2Config(vocab_size=len(tokenizer), tie_word_embeddings=False, max_position_embeddings=4096,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=im_end,
                         pad_token_id=tokenizer.pad_token_id, **SIZES)
    model = random_model(config, seed=2)
    model.generation_config.eos_token_id = im_end
    return model


def first_new_token(ids: list[int], at_least: int) -> int:
    """The first token of `ids` whose first occurrence is at position `at_least` or later (else the first token)."""
    for position, token in enumerate(ids):
        if position >= at_least and token not in ids[:position]:
            return token
    return ids[0]


class Served:
    """A model, its checkpoint directory and the engine serving it."""

    def __init__(self, model, directory: Path, engine):
        self.model, self.directory, self.engine = model, directory, engine


def serve(model, tokenizer, directory: Path, own_eos: bool, python: Path):
    """Save `model` (with `own_eos`: a generation config that also ends turns on a token the model's greedy
    continuation of PROMPTS[0] reaches after a few tokens, so that turns end inside the budget) and start its engine."""
    from components.agent.engine_client import EngineOptions, EngineProcess
    from components.agent.hf import HFPolicy
    from components.agent.types import TurnRequest
    from components.models.checkpoints import save_checkpoint

    model.eval()
    if own_eos:
        greedy = HFPolicy(model, tokenizer, greedy=True).generate(
            [TurnRequest(messages=[], token_ids=chat_prompt(tokenizer, PROMPTS[0]), max_new_tokens=MAX_TOKENS)])[0]
        model.generation_config.eos_token_id = [tokenizer.convert_tokens_to_ids("<|im_end|>"),
                                                first_new_token(greedy.token_ids, 3)]
    save_checkpoint(model, tokenizer, directory, stage="test")
    engine = EngineProcess(directory, EngineOptions(dtype="float32", threads=1), python=python)
    return Served(model, directory, engine)


@pytest.fixture(scope="session")
def tied_engine(engine_python, smol_tokenizer, tmp_path_factory):
    served = serve(tied_llama(smol_tokenizer), smol_tokenizer, tmp_path_factory.mktemp("engine_tied"), own_eos=True,
                   python=engine_python)
    yield served
    served.engine.close()


@pytest.fixture(scope="session")
def untied_engine(engine_python, smol_tokenizer, tmp_path_factory):
    served = serve(untied_qwen2(smol_tokenizer), smol_tokenizer, tmp_path_factory.mktemp("engine_untied"),
                   own_eos=False, python=engine_python)
    yield served
    served.engine.close()


def policies(served: Served, tokenizer, **sampling):
    """(engine policy, transformers policy) over the same weights, with the same sampling settings."""
    from components.agent.hf import HFPolicy
    from components.agent.vllm_backend import VLLMPolicy

    return (VLLMPolicy(str(served.directory), tokenizer=tokenizer, engine=served.engine, **sampling),
            HFPolicy(served.model, tokenizer, **sampling))


def requests(tokenizer, max_new_tokens: int = MAX_TOKENS):
    from components.agent.types import TurnRequest

    return [TurnRequest(messages=[], token_ids=chat_prompt(tokenizer, text), max_new_tokens=max_new_tokens,
                        episode_id=f"e{i}") for i, text in enumerate(PROMPTS)]


def test_engine_turns_end_where_transformers_turns_end(tied_engine, smol_tokenizer):
    """Greedy turns: the same ids, the same end-of-turn token kept, the same finished flags and texts; a budget
    shorter than the turn cuts both alike."""
    engine_policy, hf_policy = policies(tied_engine, smol_tokenizer, greedy=True)
    assert engine_policy.end_ids == hf_policy.end_ids and len(engine_policy.end_ids) == 2
    for budget in (MAX_TOKENS, 2):
        ours, theirs = engine_policy.generate(requests(smol_tokenizer, budget)), hf_policy.generate(
            requests(smol_tokenizer, budget))
        assert [t.token_ids for t in ours] == [t.token_ids for t in theirs]
        assert [t.finished for t in ours] == [t.finished for t in theirs]
        assert [t.text for t in ours] == [t.text for t in theirs]
    finished = engine_policy.generate(requests(smol_tokenizer))[0]
    assert finished.finished and finished.token_ids[-1] in engine_policy.end_ids  # the first prompt's turn ends
    assert len(finished.logprobs) == len(finished.token_ids)


def trainer_logprobs(model, prompt: list[int], sampled: list[int], temperature: float) -> list[float]:
    """The trainer's log-probabilities of `sampled` after `prompt` (components/training/rl/update.fill_logprobs)."""
    from components.training.rl.update import Rollout, fill_logprobs

    rollout = Rollout(input_ids=prompt + sampled, loss_mask=[0] * len(prompt) + [1] * len(sampled), advantage=0.0)
    return fill_logprobs(model, [rollout], 1, 0, temperature, overwrite=False)[0][len(prompt):]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_engine_logprobs_of_sampled_tokens_match_the_trainers(tied_engine, smol_tokenizer, temperature):
    """Mean |engine logp - trainer logp| over the sampled tokens at most 1e-4 in float32, also where the sampling
    temperature scales the distribution."""
    engine_policy, _ = policies(tied_engine, smol_tokenizer, temperature=temperature, seed=7)
    turns = engine_policy.generate(requests(smol_tokenizer))
    deltas = []
    for request, turn in zip(requests(smol_tokenizer), turns):
        ours = trainer_logprobs(tied_engine.model, request.token_ids, turn.token_ids, temperature)
        deltas += [abs(a - b) for a, b in zip(ours, turn.logprobs)]
    assert len(deltas) >= len(PROMPTS) * 2
    assert sum(deltas) / len(deltas) <= 1e-4


@pytest.mark.parametrize("which", ["tied_engine", "untied_engine"])
def test_after_an_rl_update_and_a_sync_the_engine_decodes_as_the_updated_policy(which, smol_tokenizer, request):
    """One update of the trainer on the engine's own samples (its mismatch and TIS weights from the engine's real
    log-probs), then the weight sync: the engine's greedy tokens equal the transformers policy's on the new
    weights, and differ from what it decoded before. The engine gets its original weights back afterwards."""
    from components.training.rl.optim import TorchOptimizer
    from components.training.rl.update import Rollout, UpdateConfig, update_policy
    from components.training.rl.rollout_backends import ROLLOUT_BACKENDS

    served: Served = request.getfixturevalue(which)
    original = copy.deepcopy(served.model)
    engine_policy, _ = policies(served, smol_tokenizer, temperature=1.0, seed=3)
    greedy_before = [t.token_ids for t in engine_policy.twin().generate(requests(smol_tokenizer))]
    turns = engine_policy.generate(requests(smol_tokenizer))
    rollouts = []
    for i, (req, turn) in enumerate(zip(requests(smol_tokenizer), turns)):
        prompt = [0.0] * len(req.token_ids)
        rollouts.append(Rollout(input_ids=req.token_ids + turn.token_ids,
                                loss_mask=[0] * len(req.token_ids) + [1] * len(turn.token_ids),
                                advantage=1.0 if i % 2 == 0 else -1.0, sampler_logprobs=prompt + turn.logprobs))
    model = served.model
    try:
        optimizer = TorchOptimizer(model, 5e-2, 0.0, 1.0, "constant", 0, 1)
        stats = update_policy(model, optimizer, rollouts, UpdateConfig(micro_batch_size=2, tis_cap=2.0), pad_id=0)
        assert stats["optimizer_steps"] == 1
        assert stats["logprob_mismatch"] <= 1e-4 and stats["tis_weight"] == pytest.approx(1.0, abs=1e-3)
        model.eval()
        sync = ROLLOUT_BACKENDS["vllm"].weight_sync(engine_policy, False)
        assert sync.push(model) == len(list(model.parameters()))
        engine_greedy, hf_greedy = policies(served, smol_tokenizer, greedy=True)
        after = [t.token_ids for t in engine_greedy.generate(requests(smol_tokenizer))]
        assert after == [t.token_ids for t in hf_greedy.generate(requests(smol_tokenizer))]
        assert after != greedy_before
    finally:
        with torch.no_grad():
            for target, source in zip(model.parameters(), original.parameters()):
                target.copy_(source)
        served.engine.push_weights(model.named_parameters())


def test_sleep_mode_on_a_cpu_engine_is_refused_with_the_reason(tied_engine, engine_python):
    from components.agent.engine_client import EngineError, EngineOptions, EngineProcess

    with pytest.raises(EngineError, match=r"release_engine_memory: true\) needs a GPU"):
        EngineProcess(tied_engine.directory, EngineOptions(dtype="float32", sleep_mode=True), python=engine_python)
    assert not tied_engine.engine.sleeps  # auto: no sleep mode on a CPU


# A stage as `star validate` runs one: it prestarts its engine, imports its libraries while the engine loads, then
# connects; it prints the prestarted process's pid and the connected one's.
STAGE = """
import sys, time
from components.agent import engine_client
from components.agent.engine_client import EngineOptions, EngineProcess
options = EngineOptions(dtype="float32")
engine_client.prestart(sys.argv[1], options, python=sys.argv[2])
[launch] = engine_client.PRESTARTED.values()
import torch, transformers
engine = EngineProcess(sys.argv[1], options, python=sys.argv[2])
print(launch.process.pid, engine.process.pid, len(engine_client.PRESTARTED), flush=True)
time.sleep(600)
"""
# A stage that prestarts an engine and exits before it asks for it (its params failed, say).
UNCLAIMED = """
import sys
from components.agent import engine_client
engine_client.prestart(sys.argv[1], python=sys.argv[2])
[launch] = engine_client.PRESTARTED.values()
print(launch.process.pid, launch.workdir, flush=True)
"""


def running(pid: int) -> bool:
    """Whether `pid` is a live (not zombie) process."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def stage_process(script: str, *args) -> subprocess.Popen:
    root = Path(__file__).resolve().parents[2]
    return subprocess.Popen([sys.executable, "-c", script, *map(str, args)], stdout=subprocess.PIPE, text=True,
                            cwd=root, env={**os.environ, "PYTHONPATH": str(root)})


def wait_gone(pid: int, timeout_s: float = 60) -> bool:
    deadline = time.monotonic() + timeout_s
    while running(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    return not running(pid)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_stage_connects_to_the_engine_it_prestarted_and_a_sigkill_leaves_none(tied_engine, engine_python):
    """The stage's EngineProcess takes the engine it prestarted (no second one); then the stage is SIGKILLed (no
    cleanup code runs) and its engine exits too."""
    stage = stage_process(STAGE, tied_engine.directory, engine_python)
    try:
        prestarted, connected, left = map(int, stage.stdout.readline().split())
        assert connected == prestarted and left == 0
        assert running(connected)
        stage.send_signal(signal.SIGKILL)
        stage.wait()
        assert wait_gone(connected)
    finally:
        stage.kill()
        stage.wait()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_prestarted_engine_nobody_asked_for_stops_with_its_stage(tied_engine, engine_python):
    stage = stage_process(UNCLAIMED, tied_engine.directory, engine_python)
    pid, workdir = stage.stdout.readline().split()
    assert stage.wait(timeout=60) == 0
    assert wait_gone(int(pid), timeout_s=10)
    assert not Path(workdir).exists()
