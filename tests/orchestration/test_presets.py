"""Presets: overlays keyed by family, deep-merged into params/ with comments kept."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import yaml

from components.errors import UserError
from components.orchestration.presets import (
    FAMILIES, MISSING, apply_preset, check_params, deep_merge, load_preset, merge_into_file,
)
from components.params import active_preset

REPO = Path(__file__).resolve().parents[2]
PRESETS = REPO / "params" / "presets"
REAL_PRESETS = ("qwen2.5-1.5b", "qwen2.5-3b", "qwen2.5-7b")
OTHER_PRESETS = (*REAL_PRESETS, "smoke", "rehearsal")  # every preset tiny must switch back from


def tiny_params(dest: Path) -> Path:
    """A copy of params/ switched to tiny: the tests do not depend on which preset the checkout has active."""
    shutil.copytree(REPO / "params", dest)
    apply_preset("tiny", dest)
    return dest


def committed_params(dest: Path) -> Path:
    """params/ as committed (HEAD), whatever the working tree holds; skips outside a git checkout."""
    import subprocess
    import tarfile

    archive = subprocess.run(["git", "-C", str(REPO), "archive", "HEAD", "params"], capture_output=True)
    if archive.returncode != 0:
        pytest.skip("not a git checkout: the committed params cannot be read")
    import io

    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(dest.parent / "committed", filter="data")
    shutil.move(dest.parent / "committed" / "params", dest)
    return dest


def leaves(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(leaves(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def test_deep_merge_replaces_leaves_and_reports_what_changed():
    base = {"rl": {"epochs": 1, "reward": {"kind": "sum", "format_reward": 0.0}}}
    changes = deep_merge(base, {"rl": {"epochs": 5, "reward": {"kind": "macro"}, "seed": 3}})
    assert base == {"rl": {"epochs": 5, "reward": {"kind": "macro", "format_reward": 0.0}, "seed": 3}}
    assert changes == [("rl.epochs", 1, 5), ("rl.reward.kind", "sum", "macro"), ("rl.seed", MISSING, 3)]


def test_merge_into_file_keeps_comments_and_untouched_keys(tmp_path):
    path = tmp_path / "sft.yaml"
    path.write_text("# sft stage\nsft:\n  epochs: 3          # passes\n  seed: 0\n  max_steps: null\n")
    changes = merge_into_file(path, "sft", {"epochs": 6})
    text = path.read_text()
    assert [str(c) for c in changes] == [f"{path}: sft.epochs: 3 -> 6"]
    assert "# sft stage" in text and "# passes" in text and "max_steps: null" in text
    assert yaml.safe_load(text) == {"sft": {"epochs": 6, "seed": 0, "max_steps": None}}


def test_apply_preset_creates_missing_files_and_records_the_preset(tmp_path):
    (tmp_path / "presets").mkdir()
    (tmp_path / "presets" / "big.yaml").write_text("rl:\n  epochs: 5\n  reward:\n    kind: sum\n")
    changes = apply_preset("big", tmp_path)
    assert yaml.safe_load((tmp_path / "rl.yaml").read_text()) == {"rl": {"epochs": 5, "reward": {"kind": "sum"}}}
    assert {c.key for c in changes} == {"rl.epochs", "rl.reward.kind"}
    assert active_preset(tmp_path) == "big"
    assert apply_preset("big", tmp_path) == []  # applying twice changes nothing


def test_a_preset_that_would_write_invalid_params_writes_nothing(tmp_path):
    (tmp_path / "presets").mkdir()
    (tmp_path / "rl.yaml").write_text("rl:\n  epochs: 1.0   # passes\n")
    (tmp_path / "sft.yaml").write_text("sft:\n  epochs: 1\n")
    (tmp_path / "presets" / "bad.yaml").write_text("sft:\n  epochs: 2\nrl:\n  reward:\n    kind: maximum\n")
    before = {name: (tmp_path / name).read_text() for name in ("rl.yaml", "sft.yaml")}
    with pytest.raises(UserError) as error:
        apply_preset("bad", tmp_path)
    assert "nothing was written" in str(error.value)
    assert "reward.kind: Input should be 'sum', 'macro', 'success' or 'curriculum'" in str(error.value)
    assert {name: (tmp_path / name).read_text() for name in before} == before  # sft.yaml untouched too
    assert active_preset(tmp_path) is None


def test_unknown_preset_lists_the_available_ones(tmp_path):
    (tmp_path / "tiny.yaml").write_text("world:\n  source: synthetic\n")
    with pytest.raises(UserError, match=r"unknown preset 'huge'.*available: tiny"):
        load_preset("huge", tmp_path)


def test_a_preset_naming_an_unknown_family_is_rejected_with_file_and_key(tmp_path):
    (tmp_path / "typo.yaml").write_text("rll:\n  epochs: 5\n")
    with pytest.raises(UserError, match=r"typo.yaml: unknown family 'rll'"):
        load_preset("typo", tmp_path)


@pytest.mark.parametrize("name", ("tiny", *OTHER_PRESETS))
def test_shipped_presets_name_only_known_families(name):
    overlay = load_preset(name, PRESETS)
    assert set(overlay) <= set(FAMILIES)


def test_tiny_restores_every_key_another_preset_sets():
    tiny = set(leaves(yaml.safe_load((PRESETS / "tiny.yaml").read_text())))
    for name in OTHER_PRESETS:
        real = set(leaves(yaml.safe_load((PRESETS / f"{name}.yaml").read_text())))
        # a key is restored when tiny sets it, or a whole block above it (teacher.endpoint: null)
        missed = [k for k in real if not any(".".join(k.split(".")[:i]) in tiny for i in range(1, k.count(".") + 2))]
        assert missed == [], f"{name} sets keys tiny does not restore: {sorted(missed)}"


@pytest.mark.parametrize("name", ("tiny", *OTHER_PRESETS))
def test_presets_name_no_path_outside_the_repository(name):
    for key, value in leaves(yaml.safe_load((PRESETS / f"{name}.yaml").read_text())).items():
        if isinstance(value, str) and "/" in value and "://" not in value:
            assert not value.startswith(("/", "~", "..")) and "/../" not in value, f"{name}: {key}: {value}"


def test_real_presets_read_the_database_from_the_project(tmp_path):
    for name in REAL_PRESETS:
        assert yaml.safe_load((PRESETS / f"{name}.yaml").read_text())["world"]["source"] == "data/travelplanner"


# What the rehearsal changes of the qwen2.5-1.5b preset: budgets and episode limits (scaled down), and what a CPU has
# instead (a random model of the same architecture, the expert teacher, no DeepSpeed, float32, FSDP2 over gloo).
REHEARSAL_SCALED = {
    "queries.sizes.rl", "rl.max_steps", "rl.num_generations", "rl.arpo.budget", "rl.arpo.initial_rollouts",
    "rl.eval.every", "rl.eval.max_queries", "rl.rollout.max_turns", "rl.rollout.max_tokens_per_turn",
    "rl.rollout.max_context_tokens", "sft.max_steps", "sft.eval_every", "sft.eval_records",
    "validate.limits.max_turns", "validate.limits.max_tokens_per_turn", "validate.limits.max_context_tokens",
}
REHEARSAL_CPU = {
    "model.source", "teacher.kind", "teacher.endpoint.base_url", "teacher.endpoint.model",
    "teacher.endpoint.api_key_env", "sft.distributed.strategy", "sft.distributed.zero_stage", "sft.dtype",
    "sft.max_minutes", "rl.max_minutes", "rl.distributed.strategy",
}


def test_the_rehearsal_is_the_1_5b_preset_with_budgets_scaled_down_and_cpu_substitutes():
    real = leaves(yaml.safe_load((PRESETS / "qwen2.5-1.5b.yaml").read_text()))
    rehearsal = leaves(yaml.safe_load((PRESETS / "rehearsal.yaml").read_text()))
    changed = {key for key, value in real.items() if rehearsal.get(key, MISSING) != value}
    assert changed == REHEARSAL_SCALED | REHEARSAL_CPU
    for key in REHEARSAL_SCALED:
        if real[key] is not None:
            assert 0 < rehearsal[key] <= real[key], key
    assert rehearsal["world.source"] == "data/travelplanner" and rehearsal["world.prompt_style"] == "full"
    assert rehearsal["model.random.architecture"] == "qwen2.5" and rehearsal["rl.distributed.strategy"] == "fsdp2"


def test_real_presets_follow_the_paper_recipe():
    for name, epochs in (("qwen2.5-1.5b", 6), ("qwen2.5-3b", 4), ("qwen2.5-7b", 4)):
        preset = yaml.safe_load((PRESETS / f"{name}.yaml").read_text())
        assert preset["sft"]["learning_rate"] == 5e-6 and preset["sft"]["epochs"] == epochs
        assert preset["sft"]["batch_size"] == 4 and preset["sft"]["cutoff_len"] == 20480
        assert preset["rl"]["epochs"] == 5 and preset["rl"]["num_generations"] == 8
        assert preset["queries"]["sizes"]["rl"] == 1000
        # the filter keeps what the teacher writes: 7-day expert trajectories take up to 56 turns (the rehearsal)
        assert preset["filter"]["max_turns"] == preset["rl"]["rollout"]["max_turns"] == 60
    assert yaml.safe_load((PRESETS / "qwen2.5-7b.yaml").read_text())["rl"]["reward"]["kind"] == "sum"
    assert yaml.safe_load((PRESETS / "qwen2.5-1.5b.yaml").read_text())["rl"]["algorithm"] == "arpo"


@pytest.mark.parametrize("name", OTHER_PRESETS)
def test_every_preset_leaves_params_that_the_stages_accept(name, tmp_path):
    tiny_params(tmp_path / "params")
    apply_preset(name, tmp_path / "params")
    assert check_params(tmp_path / "params") == []
    apply_preset("tiny", tmp_path / "params")
    assert check_params(tmp_path / "params") == []


@pytest.mark.parametrize("name", OTHER_PRESETS)
def test_switching_back_to_tiny_restores_every_value_of_the_params_files(name, tmp_path):
    def values():
        return {f.name: yaml.safe_load(f.read_text()) for f in (tmp_path / "params").glob("*.yaml")
                if f.name != "preset.yaml"}

    tiny_params(tmp_path / "params")
    before = values()
    assert apply_preset(name, tmp_path / "params") != []
    apply_preset("tiny", tmp_path / "params")
    assert {k: v for k, v in values().items() if k in before} == before


@pytest.mark.parametrize("name", OTHER_PRESETS)
def test_switching_back_to_the_committed_tiny_leaves_the_params_files_as_committed(name, tmp_path):
    committed_params(tmp_path / "params")
    before = {f.name: f.read_text() for f in (tmp_path / "params").glob("*.yaml")}
    apply_preset(name, tmp_path / "params")
    apply_preset("tiny", tmp_path / "params")
    after = {f.name: f.read_text() for f in (tmp_path / "params").glob("*.yaml") if f.name in before}
    assert after == before  # byte for byte: comments, flow lists like `days: [3]` and key order kept


def test_smoke_shrinks_every_step_budget_of_the_tiny_pipeline():
    tiny, smoke = (leaves(yaml.safe_load((PRESETS / f"{n}.yaml").read_text())) for n in ("tiny", "smoke"))
    budgets = ("sft.max_steps", "queries.sizes.sft", "queries.sizes.rl", "queries.sizes.val",
               "ood_qa.questions_per_dataset", "toolstar.tasks.sft.multi_hop", "toolstar.tasks.sft.compute",
               "toolstar_sft.max_steps")
    assert all(smoke[key] * 8 <= tiny[key] for key in budgets), {k: (tiny[k], smoke[k]) for k in budgets}
    # RL keeps two steps in smoke (a resume between steps is part of the wiring), each of a two-layer model's rollouts
    assert smoke["rl.max_steps"] == 2 <= tiny["rl.max_steps"]
    assert smoke["rl.queries_per_step"] < tiny["rl.queries_per_step"]
    assert (tiny["model.kind"], smoke["model.kind"]) == ("pretrained", "random")  # smoke: SmolLM2's shape, 2 layers


def test_tiny_is_the_committed_params_defaults(tmp_path):
    committed_params(tmp_path / "params")
    existing = {f.stem for f in (tmp_path / "params").glob("*.yaml")}
    changes = apply_preset("tiny", tmp_path / "params")
    assert [str(c) for c in changes if Path(c.file).stem in existing] == []


def test_check_params_names_the_file_and_the_bad_key(tmp_path):
    shutil.copytree(REPO / "params", tmp_path / "params")
    rl = tmp_path / "params" / "sft.yaml"
    rl.write_text(re.sub(r"^(\s+epochs:) \S+", r"\1 three", rl.read_text(), count=1, flags=re.M))
    problems = check_params(tmp_path / "params")
    assert len(problems) == 1
    assert "sft.yaml" in problems[0] and "sft.epochs" in problems[0]
