"""Start `star sft` / `star rl` under torchrun where the stage trains in a distributed world.

The transformers Trainer backend of SFT (with or without DeepSpeed) and RL's `distributed.strategy: deepspeed`
(accelerate + a DeepSpeed plugin) train in a torch.distributed world: one process per GPU, each told its place by
the launcher's variables (WORLD_SIZE, RANK, LOCAL_RANK, MASTER_ADDR, MASTER_PORT). A `star sft` / `star rl` that no
launcher started (none of WORLD_SIZE, RANK, LOCAL_RANK set) and that needs such a world runs itself again as

    python -m torch.distributed.run --standalone --nproc_per_node N -m components.cli <the same arguments>

with N from the params (`sft.distributed.processes`, `rl.distributed.processes`), and waits for it: SIGTERM and SIGINT are
passed on, and its exit code is the command's. Started by torchrun or `accelerate launch` (the variables are set),
the stage runs directly, as one of the launcher's processes.

torchrun rather than `accelerate launch`: it is part of torch, takes everything from its arguments (accelerate
launch also reads a per-user config file, ~/.cache/huggingface/accelerate/default_config.yaml, that could change the
process count, mixed precision or DeepSpeed settings behind the params' back), and both the Trainer and RL's
`Accelerator(deepspeed_plugin=...)` read the world from its variables; the DeepSpeed config is ours either way.
`--standalone` runs a single-node world on a free local port, so two stages on one machine never collide.

`launch_command` (and `sft_processes` / `rl_processes`, which read the params) decide; `run` runs the launcher.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import shlex
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from components.errors import UserError
from components.training.sft_params import SFTParams

if TYPE_CHECKING:  # an annotation only: the RL trainer's optimisers import this module
    from components.training.rl.params import RLParams

CLI_MODULE = "components.cli"
# What a launcher (torchrun, accelerate launch, deepspeed, mpirun through torch) sets in every process it starts.
WORLD_VARIABLES = ("WORLD_SIZE", "RANK", "LOCAL_RANK")
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT)
PR_SET_PDEATHSIG = 1


def launched(environ: Mapping[str, str] | None = None) -> bool:
    """Whether a launcher started this process (it set WORLD_SIZE, RANK or LOCAL_RANK)."""
    environ = os.environ if environ is None else environ
    return any(name in environ for name in WORLD_VARIABLES)


def is_main_process(environ: Mapping[str, str] | None = None) -> bool:
    """Rank 0 of the world, or a process no launcher started: the one that tracks and writes the stage's outputs."""
    environ = os.environ if environ is None else environ
    return environ.get("RANK", "0").strip() in ("", "0")


def require_launcher(purpose: str, environ: Mapping[str, str] | None = None, most: int | None = None) -> None:
    """Raise a UserError when `purpose` (a DeepSpeed path) runs in a process no launcher started, or in a world of
    more than `most` processes."""
    environ = os.environ if environ is None else environ
    if not launched(environ):
        raise UserError(
            f"{purpose} trains in a torch.distributed world, and no launcher started this process (none of "
            f"{', '.join(WORLD_VARIABLES)} is set). Run it through `star sft` / `star rl`, which start themselves "
            f"under torchrun, or start it yourself: torchrun --standalone --nproc_per_node N ... (or accelerate "
            f"launch --num_processes N ...)")
    world = environ.get("WORLD_SIZE", "1")
    if most is not None and world.isdigit() and int(world) > most:
        raise UserError(f"{purpose} trains in at most {most} process(es), and this world has {world} "
                        f"(WORLD_SIZE): launch it with --nproc_per_node {most}")


def launch_command(argv: Sequence[str], environ: Mapping[str, str], processes: int | None,
                   python: str = sys.executable, target: Sequence[str] = ("-m", CLI_MODULE)) -> list[str] | None:
    """The torchrun command that runs `target argv` (by default the star CLI with `argv`, e.g. ["sft", "--params",
    ...]) as `processes` processes; None when the command runs in this process: `processes` is None (the stage
    needs no distributed world) or a launcher already started this process."""
    if processes is None or launched(environ):
        return None
    if processes < 1:
        raise UserError(f"cannot launch {processes} processes: the process count must be at least 1")
    return [python, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes),
            *target, *map(str, argv)]


def sft_backend(params: SFTParams, cuda_available: bool | Callable[[], bool] | None = None) -> str:
    """The backend `star sft` trains with: `params.backend`, or for `auto` the Trainer where CUDA is available and
    the torch loop elsewhere (`cuda_available`: a flag, a callable, or None to ask torch)."""
    if params.backend != "auto":
        return params.backend
    if cuda_available is None:
        import torch

        cuda_available = torch.cuda.is_available
    available = cuda_available() if callable(cuda_available) else cuda_available
    return "trainer" if available else "torch"


def sft_processes(params: SFTParams, cuda_available: bool | Callable[[], bool] | None = None,
                  section: str = "sft") -> int | None:
    """How many processes `star sft` with `params` trains in under a launcher; None: the torch loop, in this one."""
    backend = sft_backend(params, cuda_available)
    processes = params.distributed.processes
    if backend == "trainer":
        return processes
    if processes > 1:
        raise UserError(
            f"{section}.distributed.processes: {processes} needs the transformers Trainer backend "
            f"({section}.backend: trainer, optionally with {section}.distributed.strategy: deepspeed), but "
            f"{section}.backend: {params.backend} trains with the plain torch loop here, in one process; set "
            f"{section}.backend: trainer or {section}.distributed.processes: 1")
    return None


def rl_processes(params: RLParams) -> int | None:
    """How many processes `star rl` with `params` trains in under a launcher (DeepSpeed's one, or the data-parallel
    replicas of plain torch); None: plain torch in this one process."""
    if params.distributed.strategy == "deepspeed" or params.distributed.processes > 1:
        return params.distributed.processes
    return None


def exit_code(returncode: int, forwarded: Sequence[int] = ()) -> int:
    """The command's exit code for the launcher's: its own, 128 + N when signal N killed it, and 128 + the first
    forwarded signal when it failed after one (torchrun exits 1 however its workers stopped; star says 130 after
    Ctrl-C and 143 after SIGTERM)."""
    if returncode < 0:
        return 128 - returncode
    if returncode != 0 and forwarded:
        return 128 + int(forwarded[0])
    return returncode


def _child_setup() -> Callable[[], None]:
    """What the launcher process does before it runs: its own process group (a Ctrl-C at the terminal reaches it
    once, from us, not twice) and, on Linux, SIGTERM when we die (no orphaned world if we are killed outright).
    libc's prctl is looked up here, before the fork."""
    prctl = None
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            prctl = ctypes.CDLL(None, use_errno=True).prctl

    def setup() -> None:
        os.setpgid(0, 0)
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)

    return setup


def run(command: Sequence[str], name: str = "star", env: Mapping[str, str] | None = None) -> int:
    """Run the launcher `command` (in `env`, default ours) to its end and return its exit code (`exit_code`);
    SIGTERM and SIGINT sent to this process are passed on to it, and it stops its workers."""
    print(f"{name}: starting a distributed world: {shlex.join(command)}", file=sys.stderr, flush=True)
    forwarded: list[int] = []
    child: subprocess.Popen | None = None

    def forward(signum: int, frame: object) -> None:
        forwarded.append(signum)
        if child is not None:
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(signum)

    main_thread = threading.current_thread() is threading.main_thread()
    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED_SIGNALS} if main_thread else {}
    try:
        child = subprocess.Popen(list(command), env=None if env is None else dict(env), preexec_fn=_child_setup())
        for signum in forwarded:  # arrived while it was starting
            child.send_signal(signum)
        returncode = child.wait()
    finally:
        if child is not None and child.poll() is None:  # we are stopping for some other reason: take it along
            child.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=60)
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
    return exit_code(returncode, forwarded)


def relaunch(args, processes: int | None) -> int | None:
    """For a stage handler: run the same star command under torchrun as `processes` processes and return its exit
    code, or None when the handler is to train in this process (`launch_command`). `args` is the parsed command
    line; `components.cli.main` keeps its arguments as `args.argv`."""
    argv = getattr(args, "argv", None)
    command = launch_command(sys.argv[1:] if argv is None else argv, os.environ, processes)
    return None if command is None else run(command, f"star {getattr(args, 'command', None) or argv[0]}")
