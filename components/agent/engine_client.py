"""The stage's side of the rollout engine: start the engine process (`engine_server.py`, vLLM in .venv-engine), talk
to it token-in/token-out over a Unix socket (`engine_protocol.py`), push weights to it, and stop it.

    engine = EngineProcess("models/sft", EngineOptions(dtype="float32", threads=1))
    [out] = engine.generate([prompt_ids], [{"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_tokens": 64,
                                            "stop_token_ids": [2], "seed": 0}])
    engine.push_weights(model.named_parameters())   # a safetensors file on tmpfs, loaded by vLLM's reload path
    engine.close()

vLLM lives in an environment of its own because it cannot share the project's (`scripts/bootstrap.sh` builds both):
the engine's interpreter is `$STAR_ENGINE_PYTHON`, else `.venv-engine/bin/python` at the repository root
(`engine_python`). The engine never outlives the stage: `close` stops it, and `atexit` calls `close` on a normal
exit or an uncaught exception; when the stage is killed (SIGTERM, SIGKILL, a crash), the engine sees its stdin pipe
close and exits, and the kernel kills it at once where PR_SET_PDEATHSIG applies (see engine_server.py).

A stage that knows its engine from its params can `prestart(model, options)` it before its heavy imports: vLLM's
import and the model's load (~10 s on CPU) then overlap the stage's own start, and the stage's
`EngineProcess(model, options)` connects to that engine.
"""
from __future__ import annotations

import atexit
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from components.agent.engine_protocol import EngineConnectionClosed, recv_message, send_message
from components.errors import UserError

REPO_ROOT = Path(__file__).resolve().parents[2]
ENGINE_PYTHON_VAR = "STAR_ENGINE_PYTHON"
DISABLED = ("", "none", "off")
BOOTSTRAP_HINT = "run ./scripts/bootstrap.sh to build .venv-engine (or use rollout backend hf)"


def engine_python() -> Path | None:
    """The engine environment's interpreter, or None where there is none: `$STAR_ENGINE_PYTHON` when set (empty,
    `none` or `off`: no engine), else `.venv-engine/bin/python` at the repository root when it exists."""
    named = os.environ.get(ENGINE_PYTHON_VAR)
    if named is not None:
        return None if named.strip().lower() in DISABLED else Path(named)
    default = REPO_ROOT / ".venv-engine" / "bin" / "python"
    return default if default.exists() else None


class EngineError(UserError):
    """The engine process failed to start, died, or refused a request."""


@dataclass(frozen=True)
class EngineOptions:
    """How the engine process holds and runs the model (engine_server.py's options)."""

    dtype: str = "auto"
    seed: int = 0
    max_model_len: int | None = None
    threads: int = 1  # CPU: torch threads of the engine (1 is fastest on a loaded 2-core machine)
    kv_cache_gib: float = 1.0  # CPU: the KV cache's size
    gpu_memory_utilization: float = 0.8
    sleep_mode: bool | str = "auto"  # sleep between rollout phases: auto (where vLLM can: a GPU), True, False
    compile: bool = False  # torch.compile the model: faster decoding, a start ~1 minute longer on CPU
    startup_timeout_s: float = 300.0


def tail(path: Path, lines: int = 40) -> str:
    """The last `lines` lines of a text file ('' if it cannot be read)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def weights_dir() -> str:
    """Where pushed weights are written: /dev/shm (tmpfs: memory, no disk) where it exists."""
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


def model_argument(model: str | os.PathLike) -> str:
    """The engine's `--model`: a local checkpoint as an absolute path (the engine runs in the repository root, not
    in the stage's directory), anything else (a Hub name) as given."""
    path = Path(model)
    return str(path.resolve()) if path.exists() else str(model)


def interpreter(python: str | os.PathLike | None = None) -> Path:
    """The engine's interpreter: `python` when given, else `engine_python()`; an EngineError saying how to build it
    where there is none."""
    python = Path(python) if python is not None else engine_python()
    if python is None or not python.exists():
        raise EngineError(f"no rollout engine environment ({python or '.venv-engine'} not found): {BOOTSTRAP_HINT}")
    return python


@dataclass(frozen=True)
class Launch:
    """An engine process just started (engine_server.py), not yet connected: `EngineProcess` waits for its socket."""

    process: subprocess.Popen
    workdir: Path
    socket_path: str
    log_path: Path

    @classmethod
    def start(cls, python: Path, model: str, options: EngineOptions) -> Launch:
        """Start the engine process for `model` (a `model_argument`) with `options`, its log in a new working
        directory."""
        workdir = Path(tempfile.mkdtemp(prefix="star-engine-"))
        socket_path, log_path = str(workdir / "engine.sock"), workdir / "engine.log"
        command = [str(python), "-m", "components.agent.engine_server", "--socket", socket_path,
                   "--model", model, "--parent-pid", str(os.getpid()), "--dtype", options.dtype,
                   "--seed", str(options.seed), "--threads", str(options.threads),
                   "--kv-cache-gib", str(options.kv_cache_gib),
                   "--gpu-memory-utilization", str(options.gpu_memory_utilization)]
        if options.max_model_len:
            command += ["--max-model-len", str(options.max_model_len)]
        sleep = options.sleep_mode if options.sleep_mode == "auto" else ("on" if options.sleep_mode else "off")
        command += ["--sleep-mode", sleep] + ["--compile"] * options.compile
        if threading.current_thread() is not threading.main_thread():
            command.append("--no-pdeathsig")  # PR_SET_PDEATHSIG fires when the starting thread ends
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]),
               "OMP_NUM_THREADS": str(options.threads), "VLLM_CPU_OMP_THREADS_BIND": "nobind",
               "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "TOKENIZERS_PARALLELISM": "false"}
        env.pop(ENGINE_PYTHON_VAR, None)
        with open(log_path, "wb") as log:
            # its own session: a Ctrl-C at the terminal reaches the stage, which then stops the engine in order
            process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=log, stderr=log, env=env,
                                       cwd=REPO_ROOT, start_new_session=True)
        return cls(process, workdir, socket_path, log_path)

    def discard(self) -> None:
        """Stop an engine nobody connected to, and remove its working directory."""
        self.process.kill()
        self.process.wait()
        shutil.rmtree(self.workdir, ignore_errors=True)


# Engines started ahead of the stage's own work (`prestart`), by (interpreter, model argument, options); an
# `EngineProcess` with the same three takes its engine from here instead of starting one.
PRESTARTED: dict[tuple[str, str, EngineOptions], Launch] = {}


def prestart(model: str | os.PathLike, options: EngineOptions = EngineOptions(),
             python: str | os.PathLike | None = None) -> bool:
    """Start the engine that `EngineProcess(model, options, python)` will ask for, now, so that it loads vLLM and
    the model while this process imports its own libraries; that `EngineProcess` then connects to it. Returns
    whether an engine was started (False where there is no engine environment: the `EngineProcess` says so). An
    engine never asked for is stopped when this process exits (or when its stdin closes with the process)."""
    try:
        python = interpreter(python)
    except EngineError:
        return False
    key = (str(python), model_argument(model), options)
    if key not in PRESTARTED:
        if not PRESTARTED:
            atexit.register(discard_prestarted)
        PRESTARTED[key] = Launch.start(python, key[1], options)
    return True


def discard_prestarted() -> None:
    """Stop every prestarted engine that no `EngineProcess` took."""
    while PRESTARTED:
        PRESTARTED.popitem()[1].discard()


class EngineProcess:
    """One engine process serving `model` (a checkpoint directory or Hub name), started at construction and ready
    when the constructor returns (or an EngineError with the engine's log tail)."""

    def __init__(self, model: str | os.PathLike, options: EngineOptions = EngineOptions(),
                 python: str | os.PathLike | None = None):
        python = interpreter(python)
        self.model, self.options = model_argument(model), options
        self.pushes = 0
        self.sync_seconds = 0.0  # the engine's own time loading weights, summed over the pushes
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        launch = PRESTARTED.pop((str(python), self.model, options), None) or Launch.start(python, self.model, options)
        self.process, self.workdir, self.log_path = launch.process, launch.workdir, launch.log_path
        self.socket_path = launch.socket_path
        atexit.register(self.close)
        try:
            self.info = self._wait_ready(options.startup_timeout_s)
        except BaseException:
            self.close()
            raise

    # ---- lifecycle -----------------------------------------------------------------------------------------
    def _wait_ready(self, timeout_s: float) -> dict:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise EngineError(f"the rollout engine exited with status {self.process.returncode} while starting "
                                  f"(model {self.model}); its log ({self.log_path}) ends:\n{tail(self.log_path)}")
            if os.path.exists(self.socket_path):
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.connect(self.socket_path)
                self._sock = sock
                return self.request({"op": "health"})
            time.sleep(0.1)
        raise EngineError(f"the rollout engine did not become ready within {timeout_s:.0f} s (model {self.model}); "
                          f"raise the startup timeout or check its log ({self.log_path}), which ends:\n"
                          f"{tail(self.log_path)}")

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the engine (a shutdown request, then SIGKILL if it has not exited within `timeout_s`; SIGKILL at once
        for one that never became ready) and remove its working directory. Idempotent."""
        atexit.unregister(self.close)
        if self._sock is None and self.process.poll() is None:  # never became ready: nothing to shut down in order
            self.process.kill()
        if self.process.poll() is None and self._sock is not None:
            try:
                self._sock.settimeout(timeout_s)
                send_message(self._sock, {"op": "shutdown"})
                recv_message(self._sock)
            except (OSError, EngineConnectionClosed):
                pass
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self.process.stdin is not None and not self.process.stdin.closed:
            self.process.stdin.close()  # the engine's watchdog exits on end-of-file
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> EngineProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- requests ------------------------------------------------------------------------------------------
    def request(self, message: dict) -> dict:
        """Send one request and return its answer; an EngineError when the engine refused it or is gone."""
        if self._sock is None:
            raise EngineError("the rollout engine is closed")
        with self._lock:
            try:
                send_message(self._sock, message)
                reply = recv_message(self._sock)
            except (OSError, EngineConnectionClosed) as exc:
                self.process.poll()
                raise EngineError(f"lost the rollout engine (exit status {self.process.returncode}) during "
                                  f"{message.get('op')!r}: {exc}; its log ends:\n{tail(self.log_path)}") from exc
        if not reply.get("ok"):
            raise EngineError(f"the rollout engine refused {message.get('op')!r}:\n{reply.get('error')}")
        return reply

    def generate(self, prompts: list[list[int]], params: list[dict]) -> list[dict]:
        """Sample a completion of each prompt (token ids) with its params (`engine_protocol.SAMPLING_KEYS`); each
        result has the sampled `token_ids` and their `logprobs`."""
        return self.request({"op": "generate", "prompts": [list(map(int, p)) for p in prompts],
                             "params": params})["outputs"]

    def push_weights(self, named_tensors: Iterable[tuple[str, object]]) -> int:
        """Load these (name, tensor) weights (checkpoint names, full tensors) into the engine: one safetensors file
        on tmpfs, read by the engine and removed afterwards. Returns the number of tensors loaded."""
        import torch
        from safetensors.torch import save_file

        dtype = None if self.options.dtype == "auto" else getattr(torch, self.options.dtype)
        tensors = {name: tensor.detach().to(device="cpu", dtype=dtype).contiguous()
                   for name, tensor in named_tensors}
        handle, path = tempfile.mkstemp(prefix="star-weights-", suffix=".safetensors", dir=weights_dir())
        os.close(handle)
        try:
            save_file(tensors, path)
            del tensors
            reply = self.request({"op": "load_weights", "path": path})
        finally:
            os.unlink(path)
        self.pushes += 1
        self.sync_seconds += reply["seconds"]
        return int(reply["tensors"])

    @property
    def sleeps(self) -> bool:
        """Whether the engine was built in sleep mode (it can free its GPU memory between phases)."""
        return bool(self.info.get("sleep_mode"))

    def sleep(self, level: int = 1) -> None:
        """Free the engine's GPU memory between phases (an engine that `sleeps`)."""
        self.request({"op": "sleep", "level": level})

    def wake_up(self, tags: list[str] | None = None) -> None:
        self.request({"op": "wake_up", "tags": tags})


def require_engine_python() -> Path:
    """The engine's interpreter, or a UserError saying how to build it."""
    python = engine_python()
    if python is None:
        raise UserError(f"rollout backend vllm needs the engine environment: {BOOTSTRAP_HINT}")
    return python


__all__ = ["EngineError", "EngineOptions", "EngineProcess", "engine_python", "prestart", "require_engine_python"]
