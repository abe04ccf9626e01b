"""ModelParams: the `model:` section of params/model.yaml (what the base_model stage builds or snapshots)."""
from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from components.params import Params
from components.synthesis.copy_task import CopyTaskParams
from components.training.sft import SFTParams


class TokenizerParams(Params):
    """The tiny preset's BPE tokenizer."""

    vocab_size: int = Field(4096, gt=300, description="total vocabulary (bytes, special tokens and tags included)")
    min_frequency: int = Field(2, ge=1, description="a pair must occur this often to be merged")
    split_names: bool = Field(True, description="split invented names into the syllables they are coined from, so an "
                                                "unseen name tokenizes like seen ones (docs/tiny_preset.md)")
    detach_name_prefix: bool = Field(
        False, description="with split_names: the space or mark before an invented name is a token of its own, so a "
                          "name is the same tokens at a line start (a table row), after a tab or after a space, and "
                          "copying it out of a tool response is an exact copy (docs/tiny_preset.md)")


class ArchitectureParams(Params):
    """The tiny Qwen2 model's size (the calibration run: hidden 192, 3 layers, about 2M parameters)."""

    hidden_size: int = Field(192, ge=8)
    num_layers: int = Field(3, ge=1)
    num_heads: int = Field(6, ge=1)
    num_kv_heads: int = Field(2, ge=1)
    intermediate_size: int = Field(512, ge=8)
    max_position_embeddings: int = Field(8192, ge=128)
    rope_theta: float = Field(10000.0, gt=0)


class ModelParams(Params):
    """`kind: tiny` trains a tokenizer, builds a Qwen2 model from `architecture` and pre-trains it on the QA task
    (`pretrain`); `kind: pretrained` snapshots `name_or_path` (a local checkpoint directory or a Hub name)."""

    kind: Literal["tiny", "pretrained"] = "tiny"
    name_or_path: str | None = None
    revision: str | None = Field(None, description="Hub commit or tag to pin (pretrained only)")
    seed: int = 0
    tokenizer: TokenizerParams = TokenizerParams()
    architecture: ArchitectureParams = ArchitectureParams()
    pretrain: SFTParams = SFTParams(epochs=2.0, learning_rate=2e-3, eval_every=100, cutoff_len=4096)
    pretrain_eval_fraction: float = Field(0.05, ge=0, lt=1, description="QA records held out for the eval loss")
    pretrain_copy: CopyTaskParams = CopyTaskParams()  # copy-task records mixed into the QA pre-training (tiny only)

    @model_validator(mode="after")
    def _no_replay_in_pretraining(self) -> "ModelParams":
        if self.pretrain.copy_replay is not None:
            raise ValueError("model.pretrain.copy_replay is for the sft stage (params/sft.yaml); the tiny base's "
                             "copy records are model.pretrain_copy")
        return self

    @model_validator(mode="after")
    def _pretrained_needs_a_source(self) -> "ModelParams":
        if self.kind == "pretrained" and not self.name_or_path:
            raise ValueError("kind: pretrained needs name_or_path (a local checkpoint directory or a Hub name "
                             "such as Qwen/Qwen2.5-1.5B-Instruct)")
        return self
