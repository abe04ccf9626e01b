"""Resumable RL checkpoints: model, optimizer, scheduler, RNG states, data cursor and the per-step history.

Layout under `--checkpoints` (a DVC `persist: true` output, so it survives `dvc repro` deleting the outputs):

    step-00000005/   model + tokenizer (save_pretrained), optimizer.{json,safetensors}, rng.{json,safetensors},
                     state.json

A checkpoint is written into a temporary sibling directory and renamed into place, and `state.json` is the last
file written: a directory named `step-N` is therefore always complete, and a run killed mid-write leaves only a
`.tmp-*` directory that the next run removes. `state.json` also holds the rows of plots/rl/rewards.csv up to that
step, so a resumed run can rewrite the plot file (which `dvc repro` deletes) without losing or repeating a step.

Optimizer and RNG states are stored as safetensors (their tensors) plus JSON (everything else), never as pickles:
loading a pickle runs whatever code the file names, and checkpoint folders get copied between machines and runs. A
file that is not what we wrote is refused with a UserError, not executed.

Each checkpoint also records the fingerprint of the inputs that produced it (`fingerprint`: hashes of the RL params,
the input model, the world and the query files). A run resumes only from a checkpoint with its own fingerprint: after
`dvc exp run -S params/rl.yaml:rl.reward.kind=macro`, a new SFT model or new queries, the old steps are removed and
the run starts from step 0, saying why.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from components.errors import UserError

STEP_DIR = re.compile(r"^step-(\d{8})$")
STATE_FILE = "state.json"
RNG_STATE = "rng"  # rng.json + rng.safetensors
TREE_FORMAT = "star-state-tree/1"


@dataclass
class TrainState:
    """What a resumed run needs besides the weights: the last finished step, the data cursor, the history rows."""

    step: int = 0
    cursor: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)


# Params a resumed run may change, as dotted paths into the params: only what does not change what is learned. The
# budget (a longer run continues the shorter one's steps), checkpointing, and throughput knobs: the device, how
# rollouts are batched and decoded (backend, episodes per call, decoding rounds, vLLM's memory share), micro-batches
# (gradient accumulation gives the same update), gradient checkpointing, and the greedy evaluations, which only log.
RESUMABLE_PARAM_CHANGES = (
    "max_steps", "epochs", "max_minutes", "checkpoint_every", "keep_checkpoints",
    "device", "micro_batch_size", "eval", "distributed.gradient_checkpointing",
    "rollout.backend", "rollout.max_batch_size", "rollout.chunk_tokens", "rollout.gpu_memory_utilization",
    "rollout.release_engine_memory",
)
SET_ASIDE_SUFFIX = ".set-aside"  # <checkpoints>.set-aside/<time>/: checkpoints of other inputs, kept with the reason
REASON_FILE = "REASON.txt"


def without_keys(params: dict[str, Any], dotted: tuple[str, ...]) -> dict[str, Any]:
    """A copy of `params` without the entries at the `dotted` paths ("rollout.max_batch_size")."""
    out = dict(params)
    nested: dict[str, list[str]] = {}
    for path in dotted:
        head, _, rest = path.partition(".")
        if rest:
            nested.setdefault(head, []).append(rest)
        else:
            out.pop(head, None)
    for head, rests in nested.items():
        if isinstance(out.get(head), dict):
            out[head] = without_keys(out[head], tuple(rests))
    return out


def hash_path(path: str | Path | None) -> str:
    """sha256 of a file's bytes, or of a directory's files (relative names and bytes, in name order); "-" for None."""
    if path is None:
        return "-"
    path = Path(path)
    digest = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for file in files:
        digest.update(str(file.relative_to(path) if path.is_dir() else file.name).encode() + b"\0")
        with file.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        digest.update(b"\0")
    return digest.hexdigest()


def fingerprint(params: dict[str, Any], inputs: dict[str, str | Path | None]) -> dict[str, str]:
    """What a checkpoint was trained from: `params` (a JSON-able dict, less RESUMABLE_PARAM_CHANGES) and each input
    file or directory, hashed."""
    kept = without_keys(params, RESUMABLE_PARAM_CHANGES)
    out = {"params": hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()}
    out.update({name: hash_path(path) for name, path in inputs.items()})
    return out


def changed_inputs(saved: dict[str, str] | None, current: dict[str, str]) -> list[str]:
    """The names whose hashes differ between a checkpoint's fingerprint and this run's (all of them when the
    checkpoint has none)."""
    if not saved:
        return ["the checkpoint records no fingerprint"]
    return [name for name in sorted(set(saved) | set(current)) if saved.get(name) != current.get(name)]


def set_aside(root: str | Path, reason: str) -> Path | None:
    """Move every complete checkpoint under `root` (another run's steps) into `<root>.set-aside/<UTC time>/`, with
    `reason` in its REASON.txt, so a new run starts from step 0 and nothing trained is lost; returns that folder
    (None when there was nothing to move)."""
    found = [path for _, path in complete_checkpoints(root)]
    if not found:
        return None
    root = Path(root)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    target = root.parent / f"{root.name}{SET_ASIDE_SUFFIX}" / stamp
    suffix = 1
    while target.exists():
        suffix += 1
        target = target.with_name(f"{stamp}-{suffix}")
    target.mkdir(parents=True)
    (target / REASON_FILE).write_text(reason.rstrip() + "\n")
    for path in found:
        shutil.move(str(path), str(target / path.name))
    return target


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def complete_checkpoints(root: str | Path) -> list[tuple[int, Path]]:
    """(step, path) of every complete checkpoint under `root`, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for path in root.iterdir():
        match = STEP_DIR.match(path.name)
        if match and path.is_dir() and (path / STATE_FILE).exists():
            found.append((int(match.group(1)), path))
    return sorted(found)


def newest_checkpoint(root: str | Path) -> Path | None:
    """The newest complete checkpoint, or None."""
    found = complete_checkpoints(root)
    return found[-1][1] if found else None


def remove_partial(root: str | Path) -> list[Path]:
    """Delete the temporary directories a killed run left behind; return them."""
    root = Path(root)
    removed = [p for p in root.glob("*.tmp-*") if p.is_dir()] if root.is_dir() else []
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
    return removed


def capture_rng() -> dict[str, Any]:
    """Python, NumPy and torch (CPU and CUDA) generator states, as tensors and plain values (see `save_tree`)."""
    name, key, pos, has_gauss, gauss = np.random.get_state()
    states = {"python": random.getstate(), "numpy": (name, key.tolist(), int(pos), int(has_gauss), float(gauss)),
              "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def restore_rng(states: dict[str, Any]) -> None:
    """Put back what `capture_rng` saved."""
    random.setstate(states["python"])
    name, key, pos, has_gauss, gauss = states["numpy"]
    np.random.set_state((name, np.asarray(key, dtype=np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def split_tensors(tree: Any) -> tuple[Any, dict[str, Any]]:
    """A JSON-ready skeleton of `tree` and its tensors by name: each tensor becomes {"tensor": name}, each tuple
    {"tuple": [...]} and each dict {"dict": [[key, value], ...]} (so int keys and tuples survive JSON)."""
    tensors: dict[str, Any] = {}

    def encode(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            name = f"t{len(tensors)}"
            tensors[name] = value.detach().to("cpu", copy=True).contiguous()
            return {"tensor": name}
        if isinstance(value, dict):
            for key in value:
                if not isinstance(key, (str, int)):
                    raise TypeError(f"cannot store the dict key {key!r} in a checkpoint: only str and int keys")
            return {"dict": [[key, encode(item)] for key, item in value.items()]}
        if isinstance(value, tuple):
            return {"tuple": [encode(item) for item in value]}
        if isinstance(value, list):
            return [encode(item) for item in value]
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        raise TypeError(f"cannot store a {type(value).__name__} in a checkpoint: only tensors, numbers, strings, "
                        "None, lists, tuples and dicts")

    return encode(tree), tensors


def join_tensors(skeleton: Any, tensors: dict[str, Any]) -> Any:
    """The tree `split_tensors` took apart; ValueError or KeyError for a skeleton it did not write."""

    def decode(node: Any) -> Any:
        if isinstance(node, list):
            return [decode(item) for item in node]
        if not isinstance(node, dict):
            return node
        if len(node) != 1:
            raise ValueError(f"unexpected entry {str(node)[:80]}")
        (tag, body), = node.items()
        if tag == "tensor":
            return tensors[body]
        if tag == "tuple":
            return tuple(decode(item) for item in body)
        if tag == "dict":
            return {key: decode(item) for key, item in body}
        raise ValueError(f"unexpected entry {tag!r}")

    return decode(skeleton)


def refused(checkpoint: Path, problem: str) -> UserError:
    """The error for a checkpoint file we will not load, saying how to get going again."""
    return UserError(f"checkpoint {checkpoint}: {problem}. Delete {checkpoint} to resume from the checkpoint before "
                     f"it, or the whole {checkpoint.parent} folder to start over")


def save_tree(directory: str | Path, stem: str, tree: Any) -> None:
    """Write `tree` (tensors in nested dicts, lists and tuples of plain values) as `<stem>.safetensors` (the
    tensors) and `<stem>.json` (the rest): formats that hold data only, unlike a pickle."""
    directory = Path(directory)
    skeleton, tensors = split_tensors(tree)
    save_file(tensors, directory / f"{stem}.safetensors")
    (directory / f"{stem}.json").write_text(json.dumps({"format": TREE_FORMAT, "tree": skeleton}) + "\n")


def load_tree(directory: str | Path, stem: str) -> Any:
    """What `save_tree(directory, stem, tree)` wrote (tensors on CPU); a UserError for anything else."""
    directory = Path(directory)
    skeleton_file, tensor_file = directory / f"{stem}.json", directory / f"{stem}.safetensors"
    missing = [path.name for path in (skeleton_file, tensor_file) if not path.is_file()]
    if missing and (directory / f"{stem}.pt").exists():
        raise refused(directory, f"{stem}.pt is a pickle from an older version of the pipeline, and pickles are not "
                                 "loaded (unpickling a file runs whatever code it names)")
    if missing:
        raise refused(directory, f"{' and '.join(missing)} missing")
    try:
        data = json.loads(skeleton_file.read_text(encoding="utf-8"))
        if not isinstance(data, dict) or data.get("format") != TREE_FORMAT:
            raise ValueError(f"not a {TREE_FORMAT} file")
        return join_tensors(data["tree"], load_file(tensor_file))
    except (ValueError, KeyError, TypeError, SafetensorError) as exc:
        raise refused(directory, f"{skeleton_file.name} / {tensor_file.name} are not the {stem} state this pipeline "
                                 f"writes ({type(exc).__name__}: {str(exc)[:200]})") from None


def write_json_atomic(path: str | Path, data: Any) -> None:
    """Write JSON through a temporary file and an atomic rename."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def rng_stem(rank: int) -> str:
    """The file stem of rank `rank`'s generator states in a checkpoint (`rng` for rank 0 and a lone process)."""
    return RNG_STATE if rank == 0 else f"{RNG_STATE}-rank{rank}"


def save_checkpoint(root: str | Path, state: TrainState, save_model, save_optimizer, keep: int,
                    rng_states: list[dict[str, Any]] | None = None) -> Path:
    """Write checkpoint `step-<state.step>` atomically and keep only the newest `keep`.

    `save_model(dir)` writes the weights and tokenizer; `save_optimizer(dir)` the optimizer/scheduler state;
    `rng_states` are every rank's generator states (`capture_rng`; default: this process's).
    """
    tmp = begin_checkpoint(root, state.step)
    save_model(tmp)
    save_optimizer(tmp)
    return finish_checkpoint(root, tmp, state, keep, rng_states)


def begin_checkpoint(root: str | Path, step: int) -> Path:
    """The empty temporary directory that checkpoint `step-<step>` is written into (`finish_checkpoint` renames
    it into place)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f"{step_dir_name(step)}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    return tmp


def finish_checkpoint(root: str | Path, tmp: Path, state: TrainState, keep: int,
                      rng_states: list[dict[str, Any]] | None = None) -> Path:
    """Complete the checkpoint written into `tmp` (`begin_checkpoint`): the generator states, then `state.json`
    last; rename it into place and keep only the newest `keep`."""
    root = Path(root)
    final = root / step_dir_name(state.step)
    for rank, states in enumerate(rng_states or [capture_rng()]):
        save_tree(tmp, rng_stem(rank), states)
    write_json_atomic(tmp / STATE_FILE, {"step": state.step, "cursor": state.cursor, "history": state.history,
                                         "extra": state.extra})
    if final.exists():  # the same step saved again (a resumed run that redid it): replace it
        shutil.rmtree(final)
    os.replace(tmp, final)
    for _, old in complete_checkpoints(root)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_state(checkpoint: str | Path) -> TrainState:
    """The TrainState of a checkpoint directory (RNG states are restored separately, see `restore_checkpoint_rng`)."""
    checkpoint = Path(checkpoint)
    try:
        data = json.loads((checkpoint / STATE_FILE).read_text(encoding="utf-8"))
        return TrainState(step=int(data["step"]), cursor=data.get("cursor", {}), history=data.get("history", []),
                          extra=data.get("extra", {}))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise refused(checkpoint, f"{STATE_FILE} is not the JSON this pipeline writes ({type(exc).__name__}: "
                                  f"{str(exc)[:200]})") from None


def restore_checkpoint_rng(checkpoint: str | Path, rank: int = 0) -> None:
    """Put back rank `rank`'s generator states saved with the checkpoint."""
    restore_rng(load_tree(checkpoint, rng_stem(rank)))
