"""The ood-qa stage's per-question results: where a checkpoint's sit (beside its metrics), reading them, and the
alignment tax that pairs a trained checkpoint's with the base model's, question by question (the ood-qa stage
computes it; the report stage fills it in where the stage could not).

The tax's interval is a percentile bootstrap of the per-question differences, resampled within each dataset,
`BOOTSTRAP_RESAMPLES` draws, seed `BOOTSTRAP_SEED` (the ood-qa stage's other intervals use the same).
"""
from __future__ import annotations

import json
from pathlib import Path

from components.errors import UserError
from components.stats import bootstrap_interval, mean_of_means

BOOTSTRAP_RESAMPLES = 2000  # percentile-bootstrap draws of every OOD QA interval
BOOTSTRAP_SEED = 0


def pair_by_question(base: list[dict], trained: list[dict]) -> dict[str, list[tuple[dict, dict]]]:
    """(base, trained) per-question results of every question, grouped by dataset, matched by `id`. Both must hold
    the same questions, scored in the same mode: otherwise the tax would compare different things."""
    base_modes, trained_modes = {r["mode"] for r in base}, {r["mode"] for r in trained}
    if base_modes != trained_modes or len(base_modes) > 1:
        raise UserError(f"the base was scored in mode {sorted(base_modes)} and the checkpoint in "
                        f"{sorted(trained_modes)}: evaluate both with the same ood_qa.mode "
                        "(re-run `star ood-qa --name base`)")
    base_by_id = _by_id(base, "base")
    trained_by_id = _by_id(trained, "checkpoint")
    if base_by_id.keys() != trained_by_id.keys():
        only_base = sorted(base_by_id.keys() - trained_by_id.keys())
        only_trained = sorted(trained_by_id.keys() - base_by_id.keys())
        raise UserError(f"the base and the checkpoint were evaluated on different questions ({len(only_base)} only "
                        f"in the base's, e.g. {only_base[:3]}; {len(only_trained)} only in the checkpoint's, e.g. "
                        f"{only_trained[:3]}): evaluate both with the same ood_qa datasets and max_questions")
    pairs: dict[str, list[tuple[dict, dict]]] = {}
    for question_id, result in trained_by_id.items():
        pairs.setdefault(result["dataset"], []).append((base_by_id[question_id], result))
    return pairs


def _by_id(results: list[dict], who: str) -> dict[str, dict]:
    by_id = {str(r["id"]): r for r in results}
    if len(by_id) != len(results):
        raise UserError(f"the {who}'s per-question results repeat question ids: give every question a unique id")
    return by_id


def _rounded(interval: tuple[float, float]) -> list[float]:
    return [round(interval[0], 4), round(interval[1], 4)]


def _tax(pairs: dict[str, list[tuple[dict, dict]]], key: str) -> dict:
    """Base minus trained on `key` (em or f1), averaged over datasets, with its paired bootstrap interval."""
    base = mean_of_means({d: [b[key] for b, _ in group] for d, group in pairs.items()})
    differences = {d: [b[key] - t[key] for b, t in group] for d, group in pairs.items()}
    tax = mean_of_means(differences)
    return {"base": base, "abs": tax, "rel": tax / base if base else None,
            "ci95": _rounded(bootstrap_interval(differences, BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED))}


def _tax_fields(pairs: dict[str, list[tuple[dict, dict]]]) -> dict:
    em, f1 = _tax(pairs, "em"), _tax(pairs, "f1")
    return {"alignment_tax_abs": em["abs"], "alignment_tax_rel": em["rel"], "alignment_tax_ci95": em["ci95"],
            "alignment_tax_f1_abs": f1["abs"], "alignment_tax_f1_rel": f1["rel"], "alignment_tax_f1_ci95": f1["ci95"],
            "alignment_tax_n": sum(len(group) for group in pairs.values()),
            "base_em": em["base"], "base_f1": f1["base"]}


def alignment_tax(base: list[dict], trained: list[dict]) -> dict:
    """Alignment tax = base score - trained score on the same questions, paired by question id: absolute, relative
    to base (None when the base scores 0) and its 95% paired bootstrap interval (per-question differences resampled
    within each dataset), for EM and F1 alongside; averaged over datasets like the scores, and per dataset under
    `per_dataset`. Positive means training cost general ability."""
    pairs = pair_by_question(base, trained)
    return {**_tax_fields(pairs), "per_dataset": {d: _tax_fields({d: group}) for d, group in pairs.items()}}


def with_tax(metrics: dict, tax: dict) -> dict:
    """The metrics with the alignment tax's averages at the top and each dataset's tax in its `per_dataset` entry."""
    per_dataset = {d: {**m, **tax["per_dataset"].get(d, {})} for d, m in metrics["per_dataset"].items()}
    return {**metrics, **{k: v for k, v in tax.items() if k != "per_dataset"}, "per_dataset": per_dataset}


def questions_path(metrics_path: str | Path) -> Path:
    """Where a checkpoint's per-question results sit: beside its metrics (metrics/ood_qa/rl.json ->
    metrics/ood_qa/rl.questions.jsonl)."""
    metrics_path = Path(metrics_path)
    return metrics_path.with_name(f"{metrics_path.stem}.questions.jsonl")


def read_question_results(path: str | Path) -> list[dict] | None:
    """A checkpoint's per-question results, or None when the file does not exist (yet)."""
    path = Path(path)
    if not path.exists():
        return None
    try:
        results = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except json.JSONDecodeError as error:
        raise UserError(f"{path} is not JSONL ({error}): re-run `star ood-qa` for that checkpoint") from None
    missing = [r for r in results if not isinstance(r, dict) or not {"id", "dataset", "mode", "em", "f1"} <= set(r)]
    if missing:
        raise UserError(f"{path}: {len(missing)} lines lack id/dataset/mode/em/f1, so they cannot be paired by "
                        "question: re-run `star ood-qa` for that checkpoint")
    return results
