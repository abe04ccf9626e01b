"""`star base-model`: resolve the pretrained checkpoint (a Hub name, a local directory, a GGUF file or a GGUF shipped
inside an installed package), convert it once into models/base, and record where it came from (with the GGUF's
sha256). `kind: random` writes a freshly initialised model of the source's architecture and tokenizer instead (the
smoke preset). Heavy libraries are imported inside the handler."""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `star base-model` to the CLI."""
    parser = subparsers.add_parser("base-model", help="resolve and snapshot the pretrained base checkpoint")
    parser.add_argument("--params", default="params/model.yaml", type=Path)
    parser.add_argument("--out", default="models/base", type=Path)
    parser.add_argument("--metrics", default="metrics/base_model.json", type=Path)
    parser.set_defaults(handler=base_model)


def base_model(args: argparse.Namespace) -> int:
    """Run the base_model stage inside one MLflow child run: write the checkpoint and its metrics."""
    from components import tracking
    from components.models.params import ModelParams
    from components.params import load_section

    params = load_section(args.params, "model", ModelParams)
    with tracking.stage_run("base_model", params=params) as run:
        summary = write_base(params, args.out)
        write_json(summary, args.metrics)
        run.log_stats(summary)
        run.set_tags({f"star.base.{key}": str(summary[key]) for key in ("source", "sha256") if summary.get(key)})
        run.log_artifact(args.metrics)
    print(f"base model ({summary['kind']}, {summary['parameters']:,} parameters, from {summary['source']}) in "
          f"{args.out}; metrics in {args.metrics}")
    return 0


def write_base(params, out: Path) -> dict:
    """Write the base checkpoint into `out` as `params` says; returns the stage summary."""
    from components.models.checkpoints import save_checkpoint, snapshot_pretrained
    from components.models.factory import count_parameters, random_model, small_qwen2
    from components.models.gguf import gguf_path, load_gguf, sha256
    from components.models.loading import check_chat_protocol, load_tokenizer

    source = gguf_path(params.source)
    summary: dict = {"kind": params.kind, "source": params.source, "revision": params.revision}
    own_architecture = params.kind == "random" and params.random.architecture != "source"  # only the tokenizer
    if source is not None:
        print(f"converting {source} (GGUF) ...", file=sys.stderr)
        summary["gguf_file"] = source.name
        summary["sha256"] = sha256(source)
        model, tokenizer = load_gguf(source, weights=not own_architecture)
    elif params.kind == "pretrained":
        snapshot_pretrained(params.source, out, revision=params.revision)
        from transformers import AutoConfig

        tokenizer = load_tokenizer(out)
        check_chat_protocol(tokenizer)
        config = AutoConfig.from_pretrained(out, local_files_only=True)
        from components.models.checkpoints import read_manifest, write_manifest

        write_manifest(out, **{**read_manifest(out), **{k: v for k, v in summary.items() if v is not None}})
        return {**summary, "model_type": config.model_type, "vocab_size": len(tokenizer),
                "parameters": parameter_count(out)}
    else:
        from transformers import AutoModelForCausalLM

        tokenizer = load_tokenizer(params.source)
        model = AutoModelForCausalLM.from_pretrained(params.source, revision=params.revision, dtype="float32")
    check_chat_protocol(tokenizer)
    if params.kind == "random":
        shape = params.random
        model = (small_qwen2(tokenizer, seed=shape.seed, hidden_size=shape.hidden_size, num_layers=shape.num_layers)
                 if shape.architecture == "qwen2.5" else
                 random_model(model.config, seed=shape.seed, num_hidden_layers=shape.num_layers))
        summary["random"] = shape.model_dump()
    if out.exists():
        shutil.rmtree(out)
    save_checkpoint(model, tokenizer, out, stage="base_model",
                    **{k: v for k, v in summary.items() if v is not None and k != "random"})
    return {**summary, "model_type": model.config.model_type, "vocab_size": len(tokenizer),
            "num_layers": model.config.num_hidden_layers, "parameters": count_parameters(model)}


def parameter_count(checkpoint: Path) -> int:
    """Parameters stored in a checkpoint's safetensors files (read from their headers, no weights loaded)."""
    from safetensors import safe_open

    total = 0
    for path in sorted(checkpoint.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as handle:
            for name in handle.keys():
                total += _product(handle.get_slice(name).get_shape())
    return total


def _product(shape) -> int:
    result = 1
    for size in shape:
        result *= size
    return result


def write_json(data: dict, path: Path) -> Path:
    """Write a metrics JSON file (folders created)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path
