"""Models: resolving a base checkpoint (Hub name, local directory, GGUF file or a GGUF shipped in a package;
`gguf.py`, `checkpoints.py`), random models of an architecture (`factory.py`), one loading path for every preset
(`loading.py`) and the base_model stage (`commands.py`)."""
