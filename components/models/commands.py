"""`star base-model`: build the tiny base (tokenizer, Qwen2 from config, QA pre-training) or snapshot a pretrained
checkpoint into models/base. Heavy libraries are imported inside the handler."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `star base-model` to the CLI."""
    parser = subparsers.add_parser("base-model", help="build (tiny) or snapshot (pretrained) the base checkpoint")
    parser.add_argument("--params", default="params/model.yaml", type=Path)
    parser.add_argument("--corpus", default="data/sft", type=Path,
                        help="SFT records whose texts train the tiny tokenizer")
    parser.add_argument("--qa", default="data/qa", type=Path,
                        help="QA data folder; its pretrain.jsonl pre-trains the tiny base")
    parser.add_argument("--out", default="models/base", type=Path)
    parser.add_argument("--metrics", default="metrics/base_model.json", type=Path)
    parser.add_argument("--plots", default="plots/base_model/loss.csv", type=Path,
                        help="per-step pre-training loss (tiny only)")
    parser.set_defaults(handler=base_model)

    probe = subparsers.add_parser(
        "copy-probe", help="how well a checkpoint copies from context, in short and in episode-long sequences")
    probe.add_argument("--model", required=True, type=Path, help="checkpoint directory (Hugging Face format)")
    probe.add_argument("--params", default="params/model.yaml", type=Path,
                       help="model.pretrain_copy draws the probe's copy records")
    probe.add_argument("--records", type=Path, default=None,
                       help="chat records JSONL (e.g. data/sft/eval.jsonl): also report copying by distance there")
    probe.add_argument("--examples", type=int, default=48, help="records per probe (default 48)")
    probe.add_argument("--out", type=Path, default=None, help="also write the report as JSON here")
    probe.set_defaults(handler=copy_probe)


def base_model(args: argparse.Namespace) -> int:
    """Run the base_model stage: read inputs, train or snapshot inside one MLflow child run, write outputs."""
    from components import tracking
    from components.models.params import ModelParams
    from components.params import load_section

    params = load_section(args.params, "model", ModelParams)
    if params.kind == "pretrained":
        with tracking.stage_run("base_model", params=params) as run:
            summary = snapshot_base(params, args.out)
            write_json(summary, args.metrics)
            run.log_metrics(numeric(summary))
            run.log_artifact(args.metrics)
    else:
        from components.models.base import corpus_records, qa_pretrain_records

        corpus = corpus_records(args.corpus)
        qa_records = qa_pretrain_records(args.qa)
        with tracking.stage_run("base_model", params=params) as run:
            summary, history = build_tiny_base(params, corpus, qa_records, args.out, on_log=run.log_metrics)
            write_json(summary, args.metrics)
            from components.training.sft import write_loss_csv

            write_loss_csv(history, args.plots)
            run.log_metrics(numeric(summary))
            run.log_artifact(args.metrics)
            run.log_artifact(args.plots)
            run.log_model(args.out)
        print(f"pre-training: loss {summary['pretrain']['first_train_loss']:.3f} -> "
              f"{summary['pretrain']['final_train_loss']:.3f}; loss curve in {args.plots}", file=sys.stderr)
    print(f"base model in {args.out}; metrics in {args.metrics}")
    return 0


def copy_probe(args: argparse.Namespace) -> int:
    """`star copy-probe`: teacher-forced copy accuracy of a checkpoint (components/models/copy_probe.py)."""
    from transformers import AutoModelForCausalLM

    from components.errors import UserError
    from components.jsonl import iter_jsonl
    from components.models.copy_probe import copy_probe_report, format_report
    from components.models.loading import load_tokenizer
    from components.models.params import ModelParams
    from components.params import load_section

    if args.examples < 1:
        raise UserError(f"--examples must be at least 1 (got {args.examples})")
    if not (args.model / "config.json").is_file():
        raise UserError(f"{args.model} is not a checkpoint directory (no config.json): pass models/base, "
                        "models/sft or another save_pretrained folder")
    params = load_section(args.params, "model", ModelParams)
    records = None
    if args.records:
        records = []
        for line, record in iter_jsonl(args.records):
            if not isinstance(record, dict) or not isinstance(record.get("messages"), list):
                raise UserError(f"{args.records}:{line}: not a chat record (no `messages` list); pass SFT records "
                                "such as data/sft/eval.jsonl")
            records.append(record)
    tokenizer = load_tokenizer(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model).eval()
    report = copy_probe_report(model, tokenizer, params.pretrain_copy, records, examples=args.examples)
    print(format_report(report))
    if args.out:
        write_json({"model": str(args.model), **report}, args.out)
    return 0


def snapshot_base(params, out: Path) -> dict:
    """Copy the pretrained checkpoint into `out` and check that it loads (config and tokenizer)."""
    from transformers import AutoConfig

    from components.models.checkpoints import snapshot_pretrained
    from components.models.loading import end_of_turn_id, load_tokenizer

    snapshot_pretrained(params.name_or_path, out, revision=params.revision)
    config = AutoConfig.from_pretrained(out, local_files_only=True)
    tokenizer = load_tokenizer(out)
    end_of_turn_id(tokenizer)
    return {"kind": "pretrained", "source": params.name_or_path, "revision": params.revision,
            "model_type": config.model_type, "vocab_size": len(tokenizer)}


def build_tiny_base(params, corpus: list[dict], qa_records: list[dict], out: Path, on_log=None) -> tuple[dict, list]:
    """Train the tokenizer on every text of the pipeline (SFT and QA records), build the tiny Qwen2 model and
    pre-train it on the QA trajectories mixed with copy-task records (`model.pretrain_copy`; assistant-only loss);
    save it into `out`. Returns (summary, history)."""
    from components.models.base import split_holdout, tokenizer_texts, tokens_per_record
    from components.models.factory import build_tiny_model, count_parameters
    from components.models.tokenizer import build_tiny_tokenizer
    from components.synthesis.copy_task import copy_records as build_copy_records
    from components.travel.synthetic import NAME_SYLLABLES
    from components.training.sft import build_examples, evaluate_token_accuracy, run_sft

    tokenizer = build_tiny_tokenizer(tokenizer_texts([*corpus, *qa_records]), vocab_size=params.tokenizer.vocab_size,
                                     min_frequency=params.tokenizer.min_frequency,
                                     name_pieces=NAME_SYLLABLES if params.tokenizer.split_names else (),
                                     detach_name_prefix=params.tokenizer.detach_name_prefix)
    arch = params.architecture

    def fresh_model(seed: int):
        return build_tiny_model(
            tokenizer, seed=seed, hidden_size=arch.hidden_size, num_layers=arch.num_layers,
            num_heads=arch.num_heads, num_kv_heads=arch.num_kv_heads, intermediate_size=arch.intermediate_size,
            max_position_embeddings=arch.max_position_embeddings, rope_theta=arch.rope_theta,
        )

    model = fresh_model(params.seed)
    # The QA mix's copy records hold route and fact rounds and observation-form values (`route_fraction`,
    # `fact_fraction`, `observation_values`); the warm-up's records are drawn without them, so the warm-up (and its
    # restart check) does not depend on those shares.
    copy_records = build_copy_records(params.pretrain_copy)
    warmup_records = build_copy_records(params.pretrain_copy.model_copy(update={
        "route_fraction": 0.0, "fact_fraction": 0.0, "observation_values": 0.0}))
    train_records, held_out = split_holdout(qa_records, params.pretrain_eval_fraction, params.seed)
    copy_train, copy_held_out = split_holdout(copy_records, params.pretrain_eval_fraction, params.seed)
    warmup_train, warmup_held_out = split_holdout(warmup_records, params.pretrain_eval_fraction, params.seed)
    cutoff, overlong = params.pretrain.cutoff_len, params.pretrain.overlong
    train, dropped_train = build_examples(tokenizer, train_records + copy_train, cutoff, overlong,
                                          source="qa/copy pretrain")
    evaluation, dropped_eval = build_examples(tokenizer, held_out + copy_held_out, cutoff, overlong,
                                              source="qa/copy pretrain (held out)")
    manifest = {"stage": "base_model", "kind": "tiny", "parameters": count_parameters(model)}
    copy_eval, _ = build_examples(tokenizer, copy_held_out, cutoff, overlong, source="copy records (held out)")
    warmup, attempts, history = None, [], []
    copy_params = params.pretrain_copy
    if warmup_train and (copy_params.warmup_minutes or copy_params.warmup_max_steps):
        copy_examples, _ = build_examples(tokenizer, warmup_train, cutoff, overlong, source="copy warm-up")
        warmup_eval, _ = build_examples(tokenizer, warmup_held_out, cutoff, overlong, source="copy warm-up (held out)")
        warmup_params = params.pretrain.model_copy(update={
            "max_minutes": copy_params.warmup_minutes, "max_steps": copy_params.warmup_max_steps or params.pretrain.max_steps,
            "epochs": max(params.pretrain.epochs, 100.0),
            "target_eval_loss": copy_params.warmup_target_loss, "lr_scheduler": copy_params.warmup_lr_scheduler})
        for attempt in range(copy_params.warmup_attempts):
            if attempt:
                model = fresh_model(params.seed + attempt)
            last = attempt == copy_params.warmup_attempts - 1
            checked = warmup_params.model_copy(update={"progress_check": None if last else copy_params.warmup_check})
            shift = len(history)
            logged = None if on_log is None else (lambda metrics, step, shift=shift: on_log(metrics, step + shift))
            warmup = run_sft(model, tokenizer, copy_examples, warmup_eval, checked, out, on_log=logged,
                             manifest={**manifest, "phase": "copy warm-up", "attempt": attempt + 1})
            history += [{**row, "step": row["step"] + shift, "phase": "copy warm-up", "attempt": attempt + 1}
                        for row in warmup.history]
            attempts.append({"attempt": attempt + 1, "model_seed": params.seed + attempt,
                             "steps": warmup.summary["steps"], "stopped": warmup.summary["stopped"],
                             "final_eval_loss": warmup.summary["final_eval_loss"]})
            if warmup.summary["stopped"] != "no_progress":
                break
            print(f"copy warm-up attempt {attempt + 1}: held-out copy loss {warmup.summary['final_eval_loss']:.3f} > "
                  f"{copy_params.warmup_check[1]} at step {copy_params.warmup_check[0]} (copying has not formed); "
                  f"restarting from a new initialisation (model seed {params.seed + attempt + 1})", file=sys.stderr)
    offset = len(history)  # one step axis across every phase
    shifted = None if on_log is None else (lambda metrics, step: on_log(metrics, step + offset))
    result = run_sft(model, tokenizer, train, evaluation, params.pretrain, out, on_log=shifted, manifest=manifest)
    summary = {
        "kind": "tiny",
        "parameters": count_parameters(model),
        "vocab_size": len(tokenizer),
        "tokens_per_sft_record": round(tokens_per_record(tokenizer, corpus), 1),
        "qa_records": len(qa_records),
        "copy_records": len(copy_records),
        "pretrain_train_examples": len(train),
        "pretrain_eval_examples": len(evaluation),
        "qa_dropped_overlong_or_empty": dropped_train + dropped_eval,
        "pretrain": result.summary,
    }
    if warmup is not None:
        summary["copy_warmup"] = {**warmup.summary, "attempts": len(attempts), "total_steps": offset}
        summary["copy_warmup_attempts"] = attempts
    if copy_eval:  # the in-context copying travel needs, measured on fresh held-out copy records
        accuracy = evaluate_token_accuracy(model, copy_eval, tokenizer.pad_token_id, params.pretrain.micro_batch_size)
        summary["copy_token_accuracy"] = round(accuracy, 4) if accuracy is not None else None
        from components.models.copy_probe import copy_accuracy

        summary["copy_accuracy"] = copy_accuracy(model, tokenizer, copy_eval, params.pretrain.micro_batch_size)
    return summary, history + [{**row, "step": row["step"] + offset, "phase": "pretrain"} for row in result.history]


def numeric(summary: dict, prefix: str = "") -> dict:
    """The numeric leaves of a nested summary as dotted keys (for MLflow)."""
    flat = {}
    for key, value in summary.items():
        if isinstance(value, dict):
            flat.update(numeric(value, f"{prefix}{key}."))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            flat[f"{prefix}{key}"] = value
    return flat


def write_json(data: dict, path: Path) -> Path:
    """Write a metrics JSON file (folders created)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path
