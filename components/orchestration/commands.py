"""`star preset use|list` and `star ui`: the project's presets and its MLflow and Prefect UIs (`star run`, `star sweep`
and `star deploy` are in `flows/commands.py`).

The implementation (presets: ruamel and pydantic; MLflow through `components.tracking`) is imported inside the
handlers, so `star --help` stays instant.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from components import lifeline
from components.errors import UserError
from components.redact import redact_url

MLFLOW_PORT = 5000
PREFECT_PORT = 4200


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the preset and UI sub-commands to `star`."""
    preset = subparsers.add_parser("preset", help="apply a per-scale preset to params/")
    preset_sub = preset.add_subparsers(dest="preset_command", metavar="ACTION", required=True)
    use = preset_sub.add_parser("use", help="deep-merge params/presets/<name>.yaml into params/<family>.yaml")
    use.add_argument("name", help="tiny, smoke, qwen2.5-1.5b, qwen2.5-3b, qwen2.5-7b, or any params/presets/<name>.yaml")
    use.add_argument("--params-dir", default="params", type=Path)
    use.set_defaults(handler=preset_use)
    listing = preset_sub.add_parser("list", help="list the presets")
    listing.add_argument("--params-dir", default="params", type=Path)
    listing.set_defaults(handler=preset_list)

    ui = subparsers.add_parser("ui", help="print (or --start) the MLflow and Prefect UIs on 127.0.0.1")
    ui.add_argument("--start", action="store_true", help="start both servers and wait (Ctrl-C or SIGTERM stops them)")
    ui.add_argument("--mlflow-port", type=int, default=MLFLOW_PORT)
    ui.add_argument("--prefect-port", type=int, default=PREFECT_PORT)
    ui.set_defaults(handler=show_ui)


def preset_use(args: argparse.Namespace) -> int:
    """Apply a preset and print every value it changed."""
    from components.orchestration.presets import apply_preset

    changes = apply_preset(args.name, args.params_dir)
    for change in changes:
        print(change)
    print(f"preset '{args.name}' applied to {args.params_dir}/ ({len(changes)} value(s) changed)")
    return 0


def preset_list(args: argparse.Namespace) -> int:
    """Print the available presets, marking the active one."""
    from components.orchestration.presets import available_presets, preset_summary
    from components.params import active_preset

    active = active_preset(args.params_dir)
    names = available_presets(args.params_dir / "presets")
    width = max(map(len, names), default=0)
    for name in names:
        summary = preset_summary(name, args.params_dir / "presets")
        print(f"{'*' if name == active else ' '} {name:<{width}}  {summary}".rstrip())
    return 0


def project_root() -> Path:
    """The project `star` runs in (the nearest folder with dvc.yaml); a UserError outside one."""
    from components.tracking import repo_root

    root = repo_root()
    if not (root / "dvc.yaml").exists():
        raise UserError(f"no dvc.yaml in {root} or its parents: run `star run` inside the project")
    return root


def ui_commands(root: Path, mlflow_port: int, prefect_port: int) -> dict[str, list[str]]:
    """The commands that serve the MLflow and Prefect UIs for this project on 127.0.0.1."""
    from components.tracking import tracking_uri

    bin_dir = Path(sys.executable).parent
    mlflow = str(bin_dir / "mlflow") if (bin_dir / "mlflow").exists() else "mlflow"
    prefect = str(bin_dir / "prefect") if (bin_dir / "prefect").exists() else "prefect"
    return {
        "mlflow": [mlflow, "ui", "--backend-store-uri", tracking_uri(root), "--host", "127.0.0.1",
                   "--port", str(mlflow_port)],
        "prefect": [prefect, "server", "start", "--host", "127.0.0.1", "--port", str(prefect_port)],
    }


def show_ui(args: argparse.Namespace) -> int:
    """Print how to open the UIs, or start both servers and wait."""
    root = project_root()
    commands = ui_commands(root, args.mlflow_port, args.prefect_port)
    ports = {"mlflow": args.mlflow_port, "prefect": args.prefect_port}
    urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    if os.environ.get("MLFLOW_TRACKING_URI", "").startswith("http"):
        print(f"MLflow server: {redact_url(os.environ['MLFLOW_TRACKING_URI'])}")
        commands.pop("mlflow")
    for name, command in commands.items():
        print(f"{name:<8} {urls[name]:<24} {redact_url(shlex.join(command))}")  # a store URI may hold a password
    print(f"then: export PREFECT_API_URL={urls['prefect']}/api")
    if "mlflow" in commands:
        from components import tracking

        name = tracking.experiment_name(root)
        print(f"experiment '{name}' in the model-training view: "
              f"{tracking.experiment_link(urls['mlflow'], tracking.existing_experiment_id(name))}")
    if not args.start:
        return 0
    for name in commands:
        if port_in_use(ports[name]):
            raise UserError(f"port {ports[name]} on 127.0.0.1 is already in use, so the {name} server cannot start: "
                            f"stop what listens there or pass --{name}-port with a free port")
    return serve(commands, root)


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something already listens on host:port (a server started there fails: `Address already in use`)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers do: TIME_WAIT is no obstacle
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def serve(commands: dict[str, list[str]], cwd: Path) -> int:
    """Run the servers until Ctrl-C or SIGTERM (0) or until one exits by itself (1); either way stop them all.

    Each server runs in a process group of its own, so stopping one stops what it started too (mlflow's uvicorn
    workers and job consumers outlive a terminated `mlflow ui`); the groups are tied to this process
    (`lifeline.tied`), so they stop even when `star ui` is killed with SIGKILL."""
    with contextlib.ExitStack() as stack:
        servers = {name: stack.enter_context(lifeline.tied(command, cwd=cwd)) for name, command in commands.items()}
        try:
            while all(process.poll() is None for process in servers.values()):
                time.sleep(1)
        except KeyboardInterrupt:
            return 0
        finally:
            stop_process_groups(list(servers.values()))
    name, process = next((name, p) for name, p in servers.items() if p.returncode is not None)
    print(f"star ui: error: the {name} server exited with code {process.returncode} (its log is above)",
          file=sys.stderr)
    return 1


def stop_process_groups(leaders: list[subprocess.Popen], timeout: float = 20) -> None:
    """SIGTERM the process groups these processes lead; SIGKILL what is left of them after `timeout` seconds."""
    def signal_groups(sig: signal.Signals) -> None:
        for leader in leaders:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(leader.pid, sig)

    signal_groups(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for leader in leaders:
        with contextlib.suppress(subprocess.TimeoutExpired):
            leader.wait(timeout=max(0.0, deadline - time.monotonic()))
    while time.monotonic() < deadline and any(_group_alive(leader.pid) for leader in leaders):
        time.sleep(0.2)  # the leader is gone; its children may still be finishing
    signal_groups(signal.SIGKILL)
    for leader in leaders:
        leader.wait()


def _group_alive(pgid: int) -> bool:
    """Whether the process group `pgid` still has a process (a zombie counts until it is reaped)."""
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True
