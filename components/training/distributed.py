"""A DeepSpeed world of one process for a plain `star sft` / `star rl` started without `accelerate launch` or
`torchrun` (shared by the SFT Trainer backend and the RL optimizer)."""
from __future__ import annotations

import os
from collections.abc import MutableMapping


def single_process_defaults(environ: MutableMapping[str, str] = os.environ) -> dict[str, str]:
    """Make a plain `star rl` (no `accelerate launch` / `torchrun`) a DeepSpeed world of one process.

    Without these variables DeepSpeed goes looking for an MPI launcher. Variables a launcher already set are kept;
    returns the ones it set."""
    defaults = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    if "WORLD_SIZE" in environ or "RANK" in environ:
        return {}
    added = {key: value for key, value in defaults.items() if key not in environ}
    environ.update(added)
    return added
