"""Model and tokenizer factories: the tiny preset's BPE tokenizer and Qwen2 model built from a config
(`tokenizer.py`, `factory.py`), one loading path for tiny and pretrained checkpoints (`loading.py`), checkpoint
helpers (`checkpoints.py`) and the base_model stage (`base.py`, `commands.py`)."""
