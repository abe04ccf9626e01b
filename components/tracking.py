"""MLflow tracking: the only module that talks to MLflow.

One experiment per preset (or the name in `STAR_EXPERIMENT`), one parent run per pipeline run (`pipeline_run`),
one child run per stage that actually ran (`stage_run`). The parent's id reaches stage processes through the
environment variable `STAR_PARENT_RUN_ID` (not `MLFLOW_RUN_ID`, which would resume the parent instead of nesting).

    with tracking.stage_run("sft", params=sft_params) as run:
        run.log_metrics({"loss": 1.2}, step=10)
        run.log_artifact("plots/sft/loss.csv")
        run.log_model("models/sft", registered_name="star-sft")   # alias @candidate

Tracking URI: `MLFLOW_TRACKING_URI`, else the absolute `sqlite:///<repo root>/mlflow.db` (never relative:
`dvc exp run --temp` runs stages in a copy under `.dvc/tmp/exps/` that is deleted afterwards). Artifacts go where
the store says (an `mlflow server --artifacts-destination s3://…` proxies them to S3; `MLFLOW_S3_ENDPOINT_URL`
points boto3 at any S3-compatible store; a local sqlite store keeps them in `mlruns/<experiment id>/` beside its
database). The training stages' runs carry MLflow's system metrics (`SYSTEM_METRICS_STAGES`); a pipeline's parent
run carries the main params (`pipeline_params`) and every checkpoint's headline metrics (`checkpoint_metrics`).
Secrets never reach MLflow: params and tags whose key names a secret, any value containing a secret from the
environment, and URL passwords and tokens (`components.redact`) are redacted.

Tracking never costs a stage: an unreachable or dying server costs a few seconds once (about 30 s for one that stops
answering), then the run says so in one line on stderr and appends every later call to a spool file,
`.star/mlflow-spool/<stage>-<utc time>-<pid>.jsonl`, which `star mlflow replay` puts into MLflow later (into the run
it belongs to when the store still has it). The parent run of `star run` and `star sweep` does the same, and once it
spools, the runs under it (sweep variants, stages) spool beside it without waiting for MLflow again; the replay
nests them under the run the parent's spool went into. A run records its process id and host: SIGTERM ends it
KILLED, and the next start of its stage marks it KILLED when its process was killed outright (SIGKILL, out of memory,
a reboot).
"""
from __future__ import annotations

import contextlib
import datetime
import fcntl
import hashlib
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import mlflow
from mlflow.entities import Dataset, DatasetInput, ExperimentTag, InputTag, Metric, Param, RunTag
from mlflow.exceptions import MlflowException
from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore
from mlflow.tracking import MlflowClient
from mlflow.tracking._tracking_service import utils as tracking_service_utils
from mlflow.tracking.context.registry import resolve_tags

from components import lifeline
from components.environ import snapshot as environ_snapshot
from components.errors import UserError
from components.params import active_preset as recorded_preset
from components.redact import REDACTED, is_secret_key, redact_url, redact_value

PARENT_RUN_ENV = "STAR_PARENT_RUN_ID"
PARENT_SPOOL_ENV = "STAR_PARENT_SPOOL"  # the spool file name of a parent run that lost MLflow
EXPERIMENT_ENV = "STAR_EXPERIMENT"
PRESET_ENV = "STAR_PRESET"
VARIANT_ENV = "STAR_VARIANT"
MODEL_ALIAS = "candidate"
_EXPS_TMP = os.path.join(".dvc", "tmp", "exps")
_MAX_PARAM_LENGTH = 6000  # MLflow's limit on a param value
SPOOL_DIR = os.path.join(".star", "mlflow-spool")
REPLAY_COMMAND = "star mlflow replay"
# What a stage waits for a server that does not answer, once: 3 tries of 8 s plus ~3 s of backoff (a refused
# connection: ~3 s). MLflow's defaults (7 retries, backoff factor 2, 120 s) wait 4 minutes for a closed port and
# longer for a hung server. A user's own setting of any of them wins.
STAGE_HTTP_LIMITS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                     "MLFLOW_HTTP_REQUEST_TIMEOUT": "8"}
UPLOAD_TIMEOUT = "120"  # MLflow's default: a server answers an upload once it has stored the file (e.g. in S3)
LIMITS_ENV = "STAR_MLFLOW_HTTP_LIMITS"  # which of them a `star` process set (not the user), for its child processes


# ---------------------------------------------------------------- where runs go

def repo_root(start: str | Path | None = None) -> Path:
    """The project root: `DVC_ROOT` (set by DVC for stage commands) or the nearest folder with dvc.yaml.

    Inside a `dvc exp run --temp` copy (`<root>/.dvc/tmp/exps/<tmp>/`) this is the original project, so that
    runs land in the project's store and not in a folder that is about to be deleted.
    """
    here = Path(os.environ.get("DVC_ROOT") or start or os.getcwd()).resolve()
    text = str(here)
    marker = os.sep + _EXPS_TMP + os.sep
    if marker in text + os.sep:
        return Path((text + os.sep).split(marker)[0])
    for folder in (here, *here.parents):
        if (folder / "dvc.yaml").exists() or (folder / ".dvc").is_dir():
            return folder
    return here


def tracking_uri(root: str | Path | None = None) -> str:
    """`MLFLOW_TRACKING_URI`, else the absolute sqlite store of the project."""
    configured = os.environ.get("MLFLOW_TRACKING_URI")
    if configured:
        return configured
    return f"sqlite:///{repo_root(root) / 'mlflow.db'}"


def active_preset(root: str | Path | None = None) -> str | None:
    """`STAR_PRESET`, else the preset recorded in params/preset.yaml by `star preset use`."""
    if os.environ.get(PRESET_ENV):
        return os.environ[PRESET_ENV]
    return recorded_preset(repo_root(root) / "params")


def experiment_name(root: str | Path | None = None) -> str:
    """`STAR_EXPERIMENT`, else `star-<preset>`, else `star`."""
    if os.environ.get(EXPERIMENT_ENV):
        return os.environ[EXPERIMENT_ENV]
    preset = active_preset(root)
    return f"star-{preset}" if preset else "star"


def default_artifact_location(uri: str | None = None) -> str | None:
    """Where a new experiment's artifacts go: what the tracking store says.

    A server (`http(s)://`) and any other store decide for themselves: None (the server's `--default-artifact-root`
    or `--artifacts-destination`, proxied as `mlflow-artifacts:/`). A local sqlite store: `mlruns/` beside its
    database, the root `ensure_sqlite_store` gives the store, and what `mlflow ui --backend-store-uri
    sqlite:///mlflow.db` run next to the database uses as `./mlruns`. Never the repository, and never the current
    folder: MLflow's own default resolves `./mlruns` against the folder of whichever process creates the experiment
    first (a `dvc exp run --temp` copy that is deleted afterwards), and bakes that absolute path into the experiment
    and its runs (a sqlite store cannot hold a relative location: MLflow resolves it when the experiment is created).
    """
    path = sqlite_path(uri or tracking_uri())
    if path is None:
        return None
    return (path.resolve().parent / "mlruns").as_uri()


# ---------------------------------------------------------------- params and secrets

def flatten(params: Any, prefix: str = "") -> dict[str, Any]:
    """Nested params (a pydantic model, dataclass-like mapping, lists) as {dotted.key: leaf}."""
    if hasattr(params, "model_dump"):
        params = params.model_dump(mode="json")
    flat: dict[str, Any] = {}
    if isinstance(params, Mapping):
        for key, value in params.items():
            flat.update(flatten(value, f"{prefix}{key}."))
        return flat
    if isinstance(params, (list, tuple)) and any(isinstance(v, (Mapping, list, tuple)) for v in params):
        for index, value in enumerate(params):
            flat.update(flatten(value, f"{prefix}{index}."))
        return flat
    return {prefix.rstrip("."): params}


def secret_values(environ: Mapping[str, str] | None = None) -> list[str]:
    """Values of environment variables whose names name a secret (never logged, wherever they appear)."""
    return [value for name, value in environ_snapshot(environ).items() if is_secret_key(name) and len(value) >= 4]


def redact(flat: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Stringified values with secrets replaced by `***` (by exact key name, by value shape, by known secret value,
    URL passwords and tokens); numbers and booleans are never secrets (`redact.redact_value`)."""
    secrets = secret_values(environ)
    clean: dict[str, str] = {}
    for key, value in flat.items():
        text = redact_value(key, value)
        if not isinstance(value, (bool, int, float)):
            for secret in secrets:
                text = text.replace(secret, REDACTED)
        clean[key] = text[:_MAX_PARAM_LENGTH]
    return clean


# ---------------------------------------------------------------- tags

def git_commit(root: Path) -> str | None:
    """The commit checked out in `root`, or None outside git."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def context_tags(stage: str | None = None, root: Path | None = None) -> dict[str, str]:
    """Tags every run carries: git commit, DVC experiment and stage, preset, sweep variant."""
    root = root or repo_root()
    tags = {"star.stage": stage or "", "dvc.stage": os.environ.get("DVC_STAGE", ""),
            "dvc.exp_name": os.environ.get("DVC_EXP_NAME", ""), "star.preset": active_preset(root) or "",
            "star.variant": os.environ.get(VARIANT_ENV, "")}
    commit = git_commit(Path(os.environ.get("DVC_ROOT", root)))
    if commit:
        tags["git.commit"] = commit
        tags["mlflow.source.git.commit"] = commit
    return {key: value for key, value in tags.items() if value}


# ---------------------------------------------------------------- datasets

def file_md5(path: Path) -> str:
    """The md5 of a file's bytes: what DVC records for a file output in dvc.lock."""
    digest = hashlib.md5()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def dvc_output_of(path: Path, root: Path) -> tuple[str, str] | None:
    """The dvc.lock output holding `path` (the file itself or a folder above it) and its md5, if any."""
    try:
        lock = _read_yaml(root / "dvc.lock") or {}
        relative = path.resolve().relative_to(root)
    except (ValueError, OSError):
        return None
    for stage in (lock.get("stages") or {}).values():
        for out in stage.get("outs") or []:
            out_path = Path(out.get("path", ""))
            if out.get("md5") and (relative == out_path or out_path in relative.parents):
                return out_path.as_posix(), out["md5"]
    return None


def dataset_record(name: str, path: Path, context: str) -> dict[str, Any]:
    """A data file as an MLflow dataset: digest = the file's md5 (DVC's for that file), source = its path in the
    workspace and the DVC output holding it with that output's md5 (a folder's `.dir` md5), profile = its rows."""
    if not path.is_file():
        raise FileNotFoundError(f"cannot log dataset '{name}': {path} is not a file")
    root = workspace_root()
    found = dvc_output_of(path, root)
    try:
        shown = path.resolve().relative_to(root).as_posix()
    except ValueError:
        shown = str(path.resolve())
    source = {"path": shown, **({"dvc_output": found[0], "dvc_md5": found[1]} if found else {})}
    with open(path, "rb") as handle:
        rows = sum(1 for line in handle if line.strip())
    return {"name": name, "digest": file_md5(path), "source_type": "dvc" if found else "local", "source": source,
            "profile": {"rows": rows}, "context": context}


# ---------------------------------------------------------------- runs

def _client():
    uri = tracking_uri()
    ensure_sqlite_store(uri)
    return MlflowClient(tracking_uri=uri)


def sqlite_path(uri: str) -> Path | None:
    """The database file of a `sqlite:///...` tracking URI (None for servers and in-memory stores)."""
    if not uri.startswith("sqlite:///") or uri == "sqlite:///:memory:":
        return None
    return Path(uri[len("sqlite:///"):])


def ensure_sqlite_store(uri: str) -> None:
    """Create and migrate a local sqlite store under a file lock, once per process.

    Two stage processes that open a store that does not exist yet both run MLflow's schema migrations, and the
    second fails with `duplicate column name` (two `star rl` runs started together). The
    lock lets one create the tables; the others then find them current.
    """
    path = sqlite_path(uri)
    if path is None or uri in _READY_STORES:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{path}.lock", "a") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            store = SqlAlchemyStore(uri, default_artifact_location(uri))  # creates and migrates the tables
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)
    _READY_STORES[uri] = store


# The local sqlite stores this process made ready, each with its artifact root beside its database (what
# `ensure_experiment` creates experiments through).
_READY_STORES: dict[str, SqlAlchemyStore] = {}


# MLflow 3 opens an experiment in the view its `mlflow.experimentKind` tag names (the UI's ExperimentKind:
# "custom_model_development" is "Machine learning", runs first; "genai_development" is "GenAI apps & agents", traces
# first) and guesses when the tag is absent; `mlflow.note.content` is the experiment's description.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
EXPERIMENT_NOTE_TAG = "mlflow.note.content"


def experiment_tags(name: str) -> dict[str, str]:
    """The tags that make experiment `name` open in MLflow's model-training view and say what made it."""
    return {EXPERIMENT_KIND_TAG: EXPERIMENT_KIND,
            EXPERIMENT_NOTE_TAG: (f"STAR pipeline experiment `{name}`, made by `star run`, `star sweep` and the DVC "
                                  "stages (`dvc repro`, `dvc exp run`) through components/tracking.py: one parent run "
                                  "per pipeline run or dvc process, one child run per stage that ran, with its params, "
                                  "metrics, artifacts and models. Named after the preset, or `STAR_EXPERIMENT`.")}


def _complete_experiment_tags(client, experiment) -> None:
    """Add the kind and description tags an experiment lacks; a kind or description already set (by a user, in the
    UI) stays."""
    for key, value in experiment_tags(experiment.name).items():
        if not experiment.tags.get(key):
            client.set_experiment_tag(experiment.experiment_id, key, value)


def ensure_experiment(name: str) -> str:
    """The id of experiment `name`, created if absent (safe when several stage processes race to create it), with
    the kind and description tags of `experiment_tags` (added to an experiment that lacks them)."""
    client = _client()
    for _ in range(5):
        found = client.get_experiment_by_name(name)
        if found is not None:
            _complete_experiment_tags(client, found)
            return found.experiment_id
        try:
            return _create_experiment(client, name)
        except MlflowException:
            time.sleep(0.2)  # another process created it between our two calls
    raise RuntimeError(f"could not create or find MLflow experiment '{name}' at {redact_url(tracking_uri())}")


# MLflow 3.17's UI opens every experiment in the view of its global GenAI / Model training switch (remembered by the
# browser, GenAI at first) and reads this query parameter before it; the experiment's kind tag is what a UI that
# chooses per experiment reads.
MODEL_TRAINING_VIEW = "workflowType=machine_learning"


def existing_experiment_id(name: str) -> str | None:
    """The id of experiment `name` in the tracking store, without creating anything (None: no such experiment, or
    no store yet, or a server that does not answer at once)."""
    uri = tracking_uri()
    path = sqlite_path(uri)
    if path is not None and not path.exists():
        return None
    try:
        with limited_http_waits():
            found = MlflowClient(tracking_uri=uri).get_experiment_by_name(name)
    except Exception:
        return None
    return found.experiment_id if found else None


def experiment_link(ui_url: str, experiment_id: str | None) -> str:
    """The UI link to an experiment's runs (the experiments list without an id) in the model-training view."""
    where = f"experiments/{experiment_id}/runs" if experiment_id else "experiments"
    return f"{ui_url}/#/{where}?{MODEL_TRAINING_VIEW}"


def _create_experiment(client, name: str) -> str:
    """Create experiment `name` where its store puts experiments: a server decides for itself; a local sqlite store
    puts it in `<artifact root>/<experiment id>` with the root beside its database (`default_artifact_location`), the
    layout MLflow gives a store's experiments (the client's own store would resolve the root against the current
    folder, and an explicit location would be shared by every experiment, without the id)."""
    uri = tracking_uri()
    store = _READY_STORES.get(uri)
    if store is None:
        return client.create_experiment(name, tags=experiment_tags(name))
    return store.create_experiment(name, tags=[ExperimentTag(key, value)
                                               for key, value in experiment_tags(name).items()])


def now_ms() -> int:
    return int(time.time() * 1000)


def numeric_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """Metrics (nested dicts flattened to dotted names) that MLflow can store: numbers, not booleans."""
    return {key: float(value) for key, value in flatten(dict(metrics)).items()
            if isinstance(value, (int, float)) and not isinstance(value, bool)}


# ---------------------------------------------------------------- what one logging call does

def _apply_params(client, run_id: str, record: Mapping) -> None:
    items = [Param(key, value) for key, value in record["params"].items()]
    for start in range(0, len(items), 100):  # MLflow takes at most 100 params per batch
        client.log_batch(run_id, params=items[start:start + 100])


def _apply_metrics(client, run_id: str, record: Mapping) -> None:
    client.log_batch(run_id, metrics=[Metric(key, value, record["timestamp"], record["step"])
                                      for key, value in record["metrics"].items()])


def _apply_tags(client, run_id: str, record: Mapping) -> None:
    client.log_batch(run_id, tags=[RunTag(key, value) for key, value in record["tags"].items()])


def _apply_artifact(client, run_id: str, record: Mapping) -> None:
    path = Path(record["path"])
    if not path.exists():
        raise FileNotFoundError(f"cannot log artifact {path}: it does not exist")
    if path.is_dir():
        client.log_artifacts(run_id, str(path), artifact_path=record["artifact_path"])
    else:
        client.log_artifact(run_id, str(path), artifact_path=record["artifact_path"])


def _apply_dict(client, run_id: str, record: Mapping) -> None:
    client.log_dict(run_id, record["data"], record["artifact_file"])


def _apply_model(client, run_id: str, record: Mapping) -> int | None:
    """Log the checkpoint as an MLflow model of the transformers flavour (the chat task, pinned requirements, a model
    card with its lineage) in the run's "Logged models"; register a version with the lineage tags and the alias."""
    model_dir, name, lineage = Path(record["model_dir"]), record["registered_name"], dict(record.get("lineage") or {})
    if not (model_dir / "config.json").exists():
        raise FileNotFoundError(f"{model_dir} is not a Hugging Face model folder (no config.json)")
    logged = client.create_logged_model(client.get_run(run_id).info.experiment_id, name="model",
                                        source_run_id=run_id, tags=lineage)
    with _process_tracking_uri(tracking_uri()):  # the flavour's upload resolves the process-wide URI
        mlflow.models.Model.log(None, name="model", flavor=mlflow.transformers, run_id=run_id,
                                model_id=logged.model_id, transformers_model=transformers_components(model_dir),
                                task=MODEL_TASK, pip_requirements=model_requirements(),
                                model_card=model_card(name or model_dir.name, lineage), await_registration_for=0)
    if not name:
        return None
    try:
        client.create_registered_model(name, description=REGISTERED_MODEL_DESCRIPTION)
    except MlflowException:
        pass  # already registered: add a version
    version = client.create_model_version(name, f"models:/{logged.model_id}", run_id=run_id, tags=lineage,
                                          model_id=logged.model_id)
    client.set_registered_model_alias(name, record["alias"], version.version)
    return int(version.version)


# What a checkpoint is in MLflow: a transformers-flavour model for chat (`mlflow.transformers.load_model` gives a
# text-generation pipeline; the pyfunc serves OpenAI-style chat requests).
MODEL_TASK = "llm/v1/chat"
REGISTERED_MODEL_DESCRIPTION = ("A STAR pipeline checkpoint (transformers flavour, chat task). Each version's tags "
                                "name the run that trained it and the digests of its training data.")


def transformers_components(model_dir: Path) -> dict[str, Any]:
    """The checkpoint's model and tokenizer, loaded from its absolute path (MLflow then never asks the Hugging Face
    Hub about it: a path is no repository name)."""
    import transformers

    path = str(model_dir.resolve())
    return {"model": transformers.AutoModelForCausalLM.from_pretrained(path, dtype="auto"),
            "tokenizer": transformers.AutoTokenizer.from_pretrained(path)}


def model_requirements() -> list[str]:
    """The model's pip requirements: the torch and transformers this process trained it with."""
    import torch
    import transformers

    return [f"torch=={torch.__version__.split('+')[0]}", f"transformers=={transformers.__version__}"]


def model_card(title: str, lineage: Mapping[str, str]):
    """A Hugging Face model card naming the checkpoint's lineage (given, so MLflow does not fetch one)."""
    from huggingface_hub import ModelCard

    lines = "\n".join(f"- `{key}`: {value}" for key, value in sorted(lineage.items()))
    return ModelCard(f"---\nlibrary_name: transformers\npipeline_tag: text-generation\n---\n# {title}\n\n"
                     f"A checkpoint of the STAR pipeline (Synthesis, SFT, RL on TravelPlanner).\n\n{lines}\n")


def _apply_input(client, run_id: str, record: Mapping) -> None:
    dataset = Dataset(name=record["name"], digest=record["digest"], source_type=record["source_type"],
                      source=json.dumps(record["source"]), profile=json.dumps(record["profile"]))
    client.log_inputs(run_id, datasets=[DatasetInput(dataset, tags=[InputTag("mlflow.data.context",
                                                                             record["context"])])])


def _apply_end(client, run_id: str, record: Mapping) -> None:
    client.set_terminated(run_id, status=record["status"], end_time=record.get("end_time"))


_APPLY: dict[str, Callable[..., Any]] = {
    "params": _apply_params, "metrics": _apply_metrics, "tags": _apply_tags, "artifact": _apply_artifact,
    "dict": _apply_dict, "model": _apply_model, "input": _apply_input, "end": _apply_end}
_UPLOADS = {"artifact", "dict", "model"}


def apply_record(client, run_id: str, record: Mapping) -> Any:
    """Do in MLflow what one record says (a live `Run` call and `replay` both come here); returns what the call
    returns (the registered model version for `model`)."""
    if record["op"] not in _UPLOADS:
        return _APPLY[record["op"]](client, run_id, record)
    with _upload_timeout():
        return _APPLY[record["op"]](client, run_id, record)


# ---------------------------------------------------------------- outages: bounded waits, a spool, one warning

_LIMITED: set[str] = set()  # the STAGE_HTTP_LIMITS this process set (and may lift for uploads)


def _inherited_limits() -> set[str]:
    """The STAGE_HTTP_LIMITS that a `star` parent process (`star run`) set in our environment, not the user."""
    named = set(os.environ.get(LIMITS_ENV, "").split(","))
    return {name for name in named & set(STAGE_HTTP_LIMITS) if os.environ.get(name) == STAGE_HTTP_LIMITS[name]}


@contextlib.contextmanager
def limited_http_waits() -> Iterator[None]:
    """MLflow's HTTP retries, backoff and timeout cut to `STAGE_HTTP_LIMITS` for the body (where the user set
    none), so that an unreachable server costs seconds instead of minutes.

    `STAR_MLFLOW_HTTP_LIMITS` names the ones set here, so that the stages a pipeline run starts take them for
    star's, not the user's, and lift the timeout for uploads as this process does."""
    added = {name: value for name, value in STAGE_HTTP_LIMITS.items() if name not in os.environ}
    ours = _inherited_limits() | set(added)
    previous_names = os.environ.get(LIMITS_ENV)
    os.environ.update(added)
    os.environ[LIMITS_ENV] = ",".join(sorted(ours))
    _LIMITED.update(ours)
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)
            _LIMITED.discard(name)
        if previous_names is None:
            os.environ.pop(LIMITS_ENV, None)
        else:
            os.environ[LIMITS_ENV] = previous_names


@contextlib.contextmanager
def _upload_timeout() -> Iterator[None]:
    """MLflow's own timeout for an upload, where `limited_http_waits` shortened it: a healthy server answers an
    upload only once it has stored the file."""
    name = "MLFLOW_HTTP_REQUEST_TIMEOUT"
    if name not in _LIMITED:
        yield
        return
    os.environ[name] = UPLOAD_TIMEOUT
    try:
        yield
    finally:
        if name in _LIMITED:
            os.environ[name] = STAGE_HTTP_LIMITS[name]


_ERROR_CAUSES = [re.compile(r"\[Errno -?\d+\][^'\"()]*"),  # [Errno 111] Connection refused
                 re.compile(r"(?:Read|Connect) timed out\.?(?: \((?:read|connect) timeout=[\d.]+\))?"),
                 re.compile(r"too many \d+ error responses")]


def describe_error(error: BaseException, limit: int = 200) -> str:
    """The gist of a failed tracking call in one short line: the cause of a failed request when there is one (MLflow
    wraps it in a paragraph about retries), else the error's type and first words."""
    text = redact_url(" ".join(str(error).split()))
    for cause in _ERROR_CAUSES:
        found = cause.search(text)
        if found:
            return found.group(0).strip()
    text = f"{type(error).__name__}: {text}" if text else type(error).__name__
    return text if len(text) <= limit else text[:limit - 3] + "..."


def spool_dir(root: str | Path | None = None) -> Path:
    """Where runs that lost MLflow keep their calls: `<repo root>/.star/mlflow-spool`."""
    return repo_root(root) / SPOOL_DIR


def pending_spools(root: str | Path | None = None) -> list[Path]:
    """The spool files not replayed yet, oldest first."""
    return sorted(spool_dir(root).glob("*.jsonl"), key=lambda path: (path.stat().st_mtime, path.name))


def new_spool(label: str, start: Mapping[str, Any]) -> Path:
    """Create `<stage>-<utc time>-<pid>.jsonl` in the spool folder, holding the run's start record."""
    folder = spool_dir()
    folder.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    safe = re.sub(r"[^A-Za-z0-9._-]+", ".", label) or "run"
    for attempt in range(1, 1000):
        path = folder / f"{safe}-{stamp}-{os.getpid()}{'' if attempt == 1 else f'-{attempt}'}.jsonl"
        try:
            with path.open("x") as handle:
                handle.write(json.dumps(dict(start)) + "\n")
            return path
        except FileExistsError:
            continue
    raise FileExistsError(f"could not create a spool file in {folder}")


def append_record(path: Path, record: Mapping[str, Any]) -> None:
    with path.open("a") as handle:
        handle.write(json.dumps(dict(record)) + "\n")


def read_spool(path: str | Path) -> list[dict]:
    """The records of a spool file: the start record, then one per logging call (a last line cut short by a killed
    process is left out)."""
    lines = Path(path).read_text().splitlines()
    records = []
    for number, line in enumerate(lines, 1):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if number < len(lines):
                raise UserError(f"{path} line {number} is not JSON: is it a spool file of a `star` run?") from None
    if not records or records[0].get("op") != "start":
        raise UserError(f"{path} is not a spool file of a `star` run (its first line is not an `op: start` record)")
    return records


def display_path(path: Path) -> str:
    """`path` relative to the working folder when it is inside it (shorter to copy into a command)."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def offline_warning(label: str, uri: str, error: BaseException, spool: Path, replay_all: bool = False) -> str:
    """The one line a run prints when it loses MLflow (`replay_all`: the runs under it spool too)."""
    shown = display_path(spool)
    command = REPLAY_COMMAND if replay_all else f"{REPLAY_COMMAND} {shown}"
    return (f"[{label}] MLflow at {redact_url(uri)} unreachable ({describe_error(error)}): logging to {shown}; "
            f"replay with `{command}`")


# ---------------------------------------------------------------- runs

# The chart section of a stage's metrics where it is not the stage's own name.
METRIC_SECTIONS = {"toolstar_eval": "toolstar"}


def stage_metric_prefix(stage: str) -> str:
    """What the metric names of `stage`'s run start with: its kind, then the checkpoint of a `kind@checkpoint` stage
    (`sft/`, `rl/`, `validate/sft/`, `toolstar/rl/`), so that MLflow's chart sections follow the pipeline."""
    kind, _, checkpoint = stage.partition("@")
    return "/".join(part for part in (METRIC_SECTIONS.get(kind, kind), checkpoint) if part) + "/"


def prefixed(prefix: str, name: str) -> str:
    """`name` under `prefix` (unchanged when it already is)."""
    return name if name.startswith(prefix) else prefix + name


@dataclass
class Run:
    """An MLflow run addressed by id (safe to use from threads: no reliance on the active run).

    Tracking never fails the caller: the first call that MLflow does not take (unreachable, a server killed
    mid-run) switches the run to its spool file with one line on stderr, and every later call goes to that file.
    `run_id` is None when MLflow could not be reached when the run started.
    """

    run_id: str | None
    experiment_id: str | None
    label: str = "run"
    start: dict = field(default_factory=dict, repr=False)  # what `replay` needs to create the run if it must
    spool: Path | None = None
    metric_prefix: str = ""  # what every metric name of the run starts with (`stage_metric_prefix`)
    lineage: dict[str, str] = field(default_factory=dict, repr=False)  # dataset digests for the models it logs
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    _monitor: Any = field(default=None, repr=False, compare=False)  # the system-metrics sampler (training stages)
    _summary_parent: str | None = field(default=None, repr=False, compare=False)  # the parent run to sum up on
    replay_all: ClassVar[bool] = False  # whether the runs under this one spool with it (the warning's command)

    @property
    def offline(self) -> bool:
        """Whether this run's calls go to its spool file instead of MLflow."""
        return self.spool is not None

    def log_params(self, params: Any) -> None:
        """Log params flattened to dotted keys, secrets redacted."""
        self._send({"op": "params", "params": redact(flatten(params))})

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        """Log numeric metrics (nested dicts flattened to dotted names) at `step`, named under the run's
        `metric_prefix` (`train_loss` of the sft stage is `sft/train_loss`): curves and evaluation results. A stage's
        one-off statistics go to `log_stats`."""
        values = {prefixed(self.metric_prefix, key): value for key, value in numeric_metrics(metrics).items()}
        if values:
            self._send({"op": "metrics", "metrics": values, "step": step or 0, "timestamp": now_ms()})

    def log_stats(self, stats: Mapping[str, Any], artifact_file: str | None = None) -> None:
        """Log a stage's one-off statistics (row counts, sizes, wall time) as `stats.<name>` tags, which the runs
        table can show as columns, and as a JSON artifact when `artifact_file` is given (stages that log their
        metrics file have it already). Not metrics: a one-point metric is a chart of one bar in the UI, and an
        experiment's chart view is for curves and results."""
        flat = flatten(dict(stats))
        if artifact_file and flat:
            self.log_dict(dict(stats), artifact_file)
        if flat:
            self.set_tags({f"stats.{key}": value for key, value in flat.items()})

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        """Set tags (values redacted like params)."""
        self._send({"op": "tags", "tags": redact(dict(tags))})

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        """Upload a file, or a folder's contents, as artifacts of this run."""
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"cannot log artifact {path}: it does not exist")
        if path.is_dir():
            artifact_path = artifact_path or path.name
        self._send({"op": "artifact", "path": str(path.resolve()), "artifact_path": artifact_path})

    def log_dict(self, data: Any, artifact_file: str) -> None:
        """Store a JSON-serialisable object as an artifact file."""
        self._send({"op": "dict", "data": data, "artifact_file": artifact_file})

    def log_input(self, name: str, path: str | Path, context: str = "training") -> None:
        """Log a data file the stage reads as an MLflow dataset input (`dataset_record`: its DVC digest, path and
        rows); the digest also goes into the lineage of the models this run logs."""
        record = dataset_record(name, Path(path), context)
        self.lineage[f"star.dataset.{name}"] = record["digest"]
        self._send({"op": "input", **record})

    def log_model(self, model_dir: str | Path, registered_name: str | None = None,
                  alias: str = MODEL_ALIAS) -> int | None:
        """Log a Hugging Face checkpoint as an MLflow model of the transformers flavour (chat task) named `model`,
        with its lineage (this run, the digests of the datasets logged with `log_input`); register a version with
        `alias` if asked.

        Returns the registered version number, or None when not registered (or MLflow is unreachable).
        """
        model_dir = Path(model_dir)
        if not (model_dir / "config.json").exists():
            raise FileNotFoundError(f"{model_dir} is not a Hugging Face model folder (no config.json)")
        if not any(model_dir.glob("*.safetensors")) and not (model_dir / "pytorch_model.bin").exists():
            raise FileNotFoundError(f"{model_dir} holds no weights (no *.safetensors, no pytorch_model.bin)")
        lineage = {"star.source_run": self.run_id or "", "star.stage": self.label, **self.lineage}
        return self._send({"op": "model", "model_dir": str(model_dir.resolve()), "registered_name": registered_name,
                           "alias": alias, "lineage": {k: v for k, v in lineage.items() if v}})

    def end(self, status: str = "FINISHED") -> None:
        """End the run: FINISHED, FAILED or KILLED (its system metrics stopped and flushed first)."""
        self.stop_system_metrics()
        self._send({"op": "end", "status": status, "end_time": now_ms()})

    def start_system_metrics(self) -> None:
        """Sample CPU, memory, disk, network (and GPUs where pynvml finds them) into this run (`system/...`)."""
        if self.run_id and not self.offline and self._monitor is None:
            self._monitor = start_system_metrics(self.run_id, self.label)

    def stop_system_metrics(self) -> None:
        """Stop the sampler and log what it holds; waits at most `SYSTEM_METRICS_STOP_S` (none once offline)."""
        monitor, self._monitor = self._monitor, None
        if monitor is None:
            return
        stopper = threading.Thread(target=monitor.finish, name="star-system-metrics-stop", daemon=True)
        stopper.start()
        stopper.join(0 if self.offline else SYSTEM_METRICS_STOP_S)

    def go_offline(self, error: BaseException | None) -> None:
        """From now on, spool every call; say so once, with the file and how to replay it. `error` None: the run's
        parent spools already, and its warning covers this run too."""
        with self._lock:
            if self.spool is not None:
                return
            self.spool = new_spool(self.label, {**self.start, "op": "start", "run_id": self.run_id,
                                                "experiment_id": self.experiment_id})
        if error is not None:
            print(offline_warning(self.label, tracking_uri(), error, self.spool, self.replay_all), file=sys.stderr,
                  flush=True)

    def _send(self, record: dict) -> Any:
        """Do `record` in MLflow, or append it to the spool once MLflow has failed this run."""
        if self.spool is None:
            try:
                return apply_record(_client(), self.run_id, record)
            except Exception as exc:  # whatever went wrong in MLflow, the stage goes on
                self.go_offline(exc)
        with self._lock:
            append_record(self.spool, record)
        return None


# ---------------------------------------------------------------- system metrics

# The stages that hold a machine for long: their runs get MLflow's system metrics (`system/cpu_utilization_percentage`,
# `system/system_memory_usage_megabytes`, `system/gpu_0_utilization_percentage`, ...). One point per 30 s, the mean
# of 3 samples 10 s apart; `MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL` and `MLFLOW_SYSTEM_METRICS_SAMPLES_BEFORE_LOGGING`
# override both, `MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING=false` turns them off.
SYSTEM_METRICS_STAGES = frozenset({"sft", "rl", "toolstar_sft", "toolstar_rl"})
SYSTEM_METRICS_INTERVAL_S = 10.0
SYSTEM_METRICS_SAMPLES = 3
SYSTEM_METRICS_STOP_S = 15.0  # what the end of a run waits for the sampler's last write at most
_SYSTEM_METRICS_OFF = {"false", "0", "no", "off"}


def system_metrics_wanted(stage: str) -> bool:
    """Whether the run of `stage` samples system metrics: the training stages, unless the user turned them off."""
    return stage in SYSTEM_METRICS_STAGES and \
        os.environ.get("MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING", "").strip().lower() not in _SYSTEM_METRICS_OFF


def start_system_metrics(run_id: str, label: str = "run"):
    """MLflow's `SystemMetricsMonitor` sampling into run `run_id`, started; None (with one line on stderr) when it
    cannot start (no psutil). It writes straight to MLflow: when MLflow goes away it stops, and its samples are not
    spooled."""
    try:
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        monitor = SystemMetricsMonitor(run_id, sampling_interval=SYSTEM_METRICS_INTERVAL_S,
                                       samples_before_logging=SYSTEM_METRICS_SAMPLES, tracking_uri=tracking_uri())
        monitor.start()
    except Exception as exc:  # system metrics are a nicety: the stage goes on without them
        print(f"[{label}] no system metrics: {describe_error(exc)}", file=sys.stderr)
        return None
    return monitor


# ---------------------------------------------------------------- runs of killed processes

def process_tags() -> dict[str, str]:
    """Who runs this run: the process id and host (to tell, later, that the process is gone)."""
    return {"star.pid": str(os.getpid()), "star.host": socket.gethostname()}


def pid_alive(pid: int) -> bool:
    """Whether a process with this id exists on this machine."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def is_orphaned(tags: Mapping[str, str], host: str, alive: Callable[[int], bool] = pid_alive) -> bool:
    """Whether a RUNNING run's process is gone: it ran on `host` (this machine) and its pid is no longer alive."""
    pid = tags.get("star.pid", "")
    return tags.get("star.host") == host and pid.isdigit() and not alive(int(pid))


def end_orphaned_runs(client, experiment_id: str, stage: str) -> list[str]:
    """Mark KILLED the RUNNING runs of `stage` whose process on this host is gone (killed by SIGKILL, out of memory,
    a reboot); returns their ids."""
    host = socket.gethostname()
    query = f"attributes.status = 'RUNNING' and tags.`star.stage` = '{stage}' and tags.`star.host` = '{host}'"
    ended = []
    for found in client.search_runs([experiment_id], filter_string=query, max_results=1000):
        if is_orphaned(found.data.tags, host):
            client.set_tag(found.info.run_id, "star.ended_by",
                           f"the next start of stage {stage} (process {found.data.tags['star.pid']} was gone)")
            client.set_terminated(found.info.run_id, status="KILLED")
            ended.append(found.info.run_id)
    if ended:
        print(f"[{stage}] marked {len(ended)} earlier run(s) KILLED: their process on {host} is gone "
              f"({', '.join(ended)})", file=sys.stderr)
    return ended


def ending_status(error: BaseException) -> str:
    """The status of a run whose body raised `error`: KILLED when stopped (SIGTERM, Ctrl-C), else FAILED."""
    return "KILLED" if isinstance(error, KeyboardInterrupt) else "FAILED"  # lifeline.Terminated is one too


# ---------------------------------------------------------------- stage runs

@contextlib.contextmanager
def stage_run(stage: str, params: Any = None, tags: Mapping[str, Any] | None = None) -> Iterator[Run]:
    """Open the MLflow run of one stage: a child of `STAR_PARENT_RUN_ID` when set, else a top-level run.

    It ends FINISHED, FAILED if the body raises, KILLED on SIGTERM or Ctrl-C. MLflow being unreachable, at the start
    or later, never fails the stage: the run goes on in its spool file (see `Run`).
    """
    with _process_tracking_uri(tracking_uri()), limited_http_waits(), lifeline.sigterm_raises():
        run = open_stage_run(stage, tags)
        try:
            if params is not None:
                run.log_params(params)
            yield run
        except BaseException as exc:
            run.end(ending_status(exc))
            refresh_parent_summary(run)
            raise
        run.end("FINISHED")
        refresh_parent_summary(run)


@contextlib.contextmanager
def _process_tracking_uri(uri: str) -> Iterator[None]:
    """mlflow's process-wide tracking URI set to `uri` for the body, then put back as it was.

    `mlflow.set_tracking_uri` is global (it also writes `MLFLOW_TRACKING_URI`): left set, it would send every later
    `MlflowClient()` of a long-lived process (a notebook, a test session) to this run's store.
    """
    previous, previous_env = tracking_service_utils._tracking_uri, os.environ.get("MLFLOW_TRACKING_URI")
    mlflow.set_tracking_uri(uri)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(previous)  # None also removes MLFLOW_TRACKING_URI
        if previous_env is not None:
            os.environ["MLFLOW_TRACKING_URI"] = previous_env


def dvc_launcher_tags() -> dict[str, str]:
    """Tags naming the `dvc repro` / `dvc exp run` process that started this stage, through shells (empty when
    something else started it: a person, a script, `star run`, which sets the parent run itself)."""
    launcher = lifeline.find_launcher(lifeline.ancestors(os.getpid()))
    if launcher is None or launcher.name.split(".")[0] != "dvc":
        return {}
    return {"star.launcher": "dvc", "star.launcher_pid": str(launcher.pid),
            "star.launcher_start": str(launcher.start_time), "star.host": socket.gethostname()}


def dvc_parent_run(client, experiment_id: str, launcher: Mapping[str, str]) -> str:
    """The parent run of the stages one dvc process runs: its first stage creates it ("dvc repro"), the others find
    it by the launcher tags. Parents of dvc processes that are gone are ended first (FINISHED: each stage's own run
    says how it ended)."""
    running = client.search_runs([experiment_id], max_results=100,
                                 filter_string="tags.`star.launcher` = 'dvc' and attributes.status = 'RUNNING'")
    mine = None
    for run in running:
        tags = run.data.tags
        if all(tags.get(key) == value for key, value in launcher.items()):
            mine = mine or run.info.run_id
            continue
        if tags.get("star.host") != launcher["star.host"]:
            continue
        process = lifeline.read_process(int(tags.get("star.launcher_pid", "0") or 0))
        if process is None or str(process.start_time) != tags.get("star.launcher_start") or process.state == "Z":
            client.set_terminated(run.info.run_id, "FINISHED")
    if mine:
        return mine
    created = client.create_run(experiment_id, run_name="dvc repro",
                                tags={**redact({k: v for k, v in context_tags(None).items() if k != "dvc.stage"}),
                                      **launcher}).info.run_id
    _apply_params(client, created, {"params": redact(pipeline_params(workspace_root()))})
    return created


def open_stage_run(stage: str, tags: Mapping[str, Any] | None = None) -> Run:
    """Create the stage's run (after marking its runs of dead processes KILLED); offline when MLflow fails. Under
    `star run` the flow's run is its parent; under plain `dvc repro` the run of that dvc process
    (`dvc_parent_run`)."""
    parent_id = os.environ.get(PARENT_RUN_ENV) or None
    parent_spool = os.environ.get(PARENT_SPOOL_ENV) or None
    launcher = {} if parent_id or parent_spool else dvc_launcher_tags()
    run_tags = {**context_tags(stage), **process_tags(), **dict(tags or {})}
    if parent_id:
        run_tags["mlflow.parentRunId"] = parent_id
    start = {"op": "start", "run_name": stage, "experiment": experiment_name(), "parent_run_id": parent_id,
             "parent_spool": parent_spool, "tags": redact(resolve_tags(run_tags)), "start_time": now_ms()}
    run = Run(None, None, label=stage, start=start, metric_prefix=stage_metric_prefix(stage))
    if parent_spool:  # the pipeline's run lost MLflow: spool beside it instead of waiting for MLflow again
        run.go_offline(None)
        return run
    try:
        client = _client()
        experiment_id = client.get_run(parent_id).info.experiment_id if parent_id else ensure_experiment(
            start["experiment"])
        if launcher:
            parent_id = start["parent_run_id"] = dvc_parent_run(client, experiment_id, launcher)
            start["tags"]["mlflow.parentRunId"] = parent_id
        end_orphaned_runs(client, experiment_id, stage)
        created = client.create_run(experiment_id, start_time=start["start_time"], tags=start["tags"],
                                    run_name=stage)
    except Exception as exc:  # unreachable (or refusing): the stage runs offline
        run.go_offline(exc)
        return run
    run.run_id, run.experiment_id = created.info.run_id, experiment_id
    run._summary_parent = parent_id
    if system_metrics_wanted(stage):
        run.start_system_metrics()
    print(f"[{stage}] MLflow run {run.run_id} in experiment '{start['experiment']}' at "
          f"{redact_url(tracking_uri())}" + (f" (parent {parent_id})" if parent_id else ""), file=sys.stderr)
    return run


# ---------------------------------------------------------------- replay

def _existing_run(client, run_id: str | None) -> str | None:
    """`run_id` when that run exists in the store, else None (another store, or deleted)."""
    if not run_id:
        return None
    try:
        client.get_run(run_id)
    except MlflowException as exc:
        if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
            return None
        raise
    return run_id


def _replayed_into(client, start: Mapping[str, Any], spool_name: str) -> str | None:
    """The run that the spool `spool_name` was replayed into (tagged `star.replayed_from`), if any."""
    experiment_id = ensure_experiment(start.get("experiment") or experiment_name())
    found = client.search_runs([experiment_id], filter_string=f"tags.`star.replayed_from` = '{spool_name}'",
                               max_results=1)
    return found[0].info.run_id if found else None


def _replay_parent(client, start: Mapping[str, Any], spool: Path) -> str | None:
    """The run a spooled run nests under: its parent when the store has it, else the run that its parent's spool
    went into (replaying that spool first when it is still pending); None for a top-level run."""
    parent_id = _existing_run(client, start.get("parent_run_id"))
    parent_spool = start.get("parent_spool")
    if parent_id or not parent_spool:
        return parent_id
    if spool.with_name(parent_spool).is_file():
        return replay(spool.with_name(parent_spool))
    return _replayed_into(client, start, parent_spool)


def _replay_run(client, start: Mapping[str, Any], spool: Path) -> str:
    """A new run for a spool whose run MLflow never created (or no longer has)."""
    tags = dict(start.get("tags") or {})
    parent_id = _replay_parent(client, start, spool)
    if parent_id:
        tags["mlflow.parentRunId"] = parent_id
        experiment_id = client.get_run(parent_id).info.experiment_id
    else:
        tags.pop("mlflow.parentRunId", None)
        experiment_id = ensure_experiment(start.get("experiment") or experiment_name())
    if start.get("run_id"):
        tags["star.original_run_id"] = start["run_id"]
    created = client.create_run(experiment_id, start_time=start.get("start_time"), tags=tags,
                                run_name=start.get("run_name") or spool.stem)
    return created.info.run_id


def replay(spool: str | Path) -> str:
    """Put a spool file into MLflow: into its run when the store still has it, else into a new run (under the run
    its parent's spool went into, when its parent spooled too); a run whose spool has no end ends KILLED. Tags the
    run `star.replayed_from`, renames the file to `*.replayed`; returns the run id."""
    spool = Path(spool)
    start, *calls = read_spool(spool)
    with _process_tracking_uri(tracking_uri()):
        client = _client()
        run_id = _existing_run(client, start.get("run_id")) or _replay_run(client, start, spool)
        client.set_tag(run_id, "star.replayed_from", spool.name)
        for record in calls:
            try:
                apply_record(client, run_id, record)
            except FileNotFoundError as exc:  # an artifact deleted since: the rest still counts
                print(f"replay {spool.name}: skipped {record['op']}: {exc}", file=sys.stderr)
        if not any(record["op"] == "end" for record in calls):
            last = max([start.get("start_time") or 0] + [r.get("timestamp", 0) for r in calls])
            apply_record(client, run_id, {"op": "end", "status": "KILLED", "end_time": last or now_ms()})
    spool.rename(spool.with_name(spool.name + ".replayed"))
    return run_id


@dataclass
class PipelineRun(Run):
    """The parent run of a pipeline or sweep: stages report what happened to them here.

    Like a stage's run it never fails the pipeline: without MLflow it spools (one warning), and so do the runs
    under it from then on. Share one object between threads, so that an outage costs its wait and warning once."""

    replay_all: ClassVar[bool] = True

    def env(self) -> dict[str, str]:
        """Environment for stage processes: an absolute tracking URI, the parent id, and once this run spools,
        its spool (the stages then spool beside it at once)."""
        env = {"MLFLOW_TRACKING_URI": tracking_uri(), EXPERIMENT_ENV: experiment_name()}
        if self.run_id:
            env[PARENT_RUN_ENV] = self.run_id
        if self.spool is not None:
            env[PARENT_SPOOL_ENV] = self.spool.name
        return env

    def record_stage(self, stage: str, status: str, lock_hash: str | None = None,
                     seconds: float | None = None) -> None:
        """Record a stage's outcome on the parent: `ran`, `unchanged`, `restored` (from the run cache) or `failed`.

        The lock hash (DVC's run-cache key of the stage's dvc.lock entry) also goes on the stage's child run,
        since DVC writes dvc.lock only after the stage's command has exited.
        """
        safe = stage.replace("@", ".")
        tags = {f"stage.{safe}.status": status}
        if lock_hash:
            tags[f"stage.{safe}.lock_hash"] = lock_hash
        if seconds is not None:
            tags[f"stage.{safe}.seconds"] = f"{seconds:.1f}"
        self.set_tags(tags)
        if lock_hash and status == "ran" and not self.offline:
            try:
                children = child_runs(self.run_id, stage)
            except Exception as exc:  # MLflow went away: the hash is on this run's tags (spooled) all the same
                self.go_offline(exc)
                return
            for child in children:
                Run(child.info.run_id, self.experiment_id).set_tags({"dvc.lock_hash": lock_hash})


def child_runs(parent_run_id: str, stage: str | None = None) -> list:
    """The child runs of a parent (optionally only those of one DVC stage address like `validate@sft`)."""
    client = _client()
    parent = client.get_run(parent_run_id)
    query = f"tags.mlflow.parentRunId = '{parent_run_id}'"
    if stage:
        query += f" and tags.`dvc.stage` = '{stage}'"
    return client.search_runs([parent.info.experiment_id], filter_string=query, max_results=1000)


def open_pipeline_run(name: str, tags: Mapping[str, Any] | None = None,
                      parent: PipelineRun | None = None) -> PipelineRun:
    """Create the run of a pipeline or sweep (or of a sweep variant, under `parent`); offline when MLflow fails,
    and at once when `parent` spools already."""
    parent_id = parent.run_id if parent else None
    all_tags = {"mlflow.runName": name, **context_tags(), **dict(tags or {})}
    if parent_id:
        all_tags["mlflow.parentRunId"] = parent_id
    start = {"op": "start", "run_name": name, "experiment": experiment_name(), "parent_run_id": parent_id,
             "parent_spool": parent.spool.name if parent and parent.offline else None, "tags": redact(all_tags),
             "start_time": now_ms()}
    run = PipelineRun(None, None, label=name, start=start)
    if start["parent_spool"]:
        run.go_offline(None)
        return run
    try:
        client = _client()
        experiment_id = parent.experiment_id if parent_id else ensure_experiment(start["experiment"])
        created = client.create_run(experiment_id, start_time=start["start_time"], tags=start["tags"], run_name=name)
    except Exception as exc:  # unreachable (or refusing): the pipeline runs, its run spools
        run.go_offline(exc)
        return run
    run.run_id, run.experiment_id = created.info.run_id, experiment_id
    print(f"MLflow parent run {run.run_id} ('{name}') in experiment '{start['experiment']}' at "
          f"{redact_url(tracking_uri())}", file=sys.stderr)
    return run


@contextlib.contextmanager
def pipeline_run(name: str, params: Any = None, tags: Mapping[str, Any] | None = None,
                 parent: PipelineRun | None = None, summary_root: str | Path | None = None) -> Iterator[PipelineRun]:
    """The parent run of a pipeline (or of a sweep variant, under `parent`) for the body.

    With `summary_root` (the workspace the pipeline ran in) the run, as it ends, also gets the headline metrics of
    every checkpoint that the metrics files there hold (`checkpoint_metrics`), whatever the pipeline's outcome.

    Uses explicit run ids only, so Prefect tasks in threads can log to it. Ends FINISHED, FAILED if the body
    raises, KILLED on SIGTERM or Ctrl-C. MLflow's HTTP waits are cut as for stages (`limited_http_waits`), so an
    unreachable server costs seconds (about 30 s for one that never answers) once, and the pipeline goes on.
    """
    with limited_http_waits():
        run = open_pipeline_run(name, tags, parent)
        if params is not None:
            run.log_params(params)
        try:
            yield run
        except BaseException as exc:
            if summary_root is not None:
                log_checkpoint_metrics(run, summary_root)
            run.end(ending_status(exc))
            raise
        if summary_root is not None:
            log_checkpoint_metrics(run, summary_root)
        run.end("FINISHED")


# ---------------------------------------------------------------- what a pipeline's parent run sums up

# The knobs a comparison of pipeline runs turns on, as `<params file family>.<key path>` in params/<family>.yaml
# (the top-level key of each file is its family). The parent run logs those the files set, and the preset.
PIPELINE_PARAM_KEYS = (
    "model.kind", "model.source",
    "sft.epochs", "sft.max_steps", "sft.learning_rate", "sft.backend",
    "rl.algorithm", "rl.reward.kind", "rl.learning_rate", "rl.num_generations", "rl.epochs", "rl.max_steps",
    "toolstar_sft.epochs", "toolstar_sft.max_steps", "toolstar_sft.learning_rate",
    "toolstar_rl.algorithm", "toolstar_rl.reward.kind", "toolstar_rl.learning_rate", "toolstar_rl.num_generations",
    "toolstar_rl.max_steps",
)

# The headline metrics of a checkpoint, per metrics folder (`metrics/<folder>/<checkpoint>.json`): the name the
# parent run logs (`<folder>/<checkpoint>/<name>`) and the key path in the file (docs/contracts.md).
HEADLINE_METRICS: dict[str, dict[str, tuple[str, ...]]] = {
    "validate": {"final_pass": ("strict", "final_pass"), "delivery_rate": ("strict", "delivery_rate"),
                 "commonsense_micro": ("strict", "commonsense_micro"),
                 "commonsense_macro": ("strict", "commonsense_macro"), "hard_micro": ("strict", "hard_micro"),
                 "hard_macro": ("strict", "hard_macro"), "official_final_pass": ("official", "final_pass")},
    "ood_qa": {"em": ("em",), "f1": ("f1",), "tax": ("alignment_tax_abs",), "tax_f1": ("alignment_tax_f1_abs",)},
    "toolstar": {"accuracy": ("accuracy",), "em": ("em",), "f1": ("f1",), "mean_reward": ("mean_reward",)},
}


def workspace_root() -> Path:
    """The folder the running stage works in: `DVC_ROOT`, else the current folder (unlike `repo_root`, a `dvc exp
    run --temp` copy stays itself: its params and metrics are the experiment's)."""
    return Path(os.environ.get("DVC_ROOT") or os.getcwd()).resolve()


def _dig(data: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(data, Mapping):
            return None
        data = data.get(key)
    return data


def _read_yaml(path: Path) -> Any:
    import yaml

    try:
        return yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return None


def pipeline_params(root: str | Path) -> dict[str, Any]:
    """The preset and the `PIPELINE_PARAM_KEYS` that `root/params/*.yaml` set (absent files and keys are left out)."""
    root = Path(root)
    found: dict[str, Any] = {"preset": os.environ.get(PRESET_ENV) or recorded_preset(root / "params") or ""}
    files: dict[str, Any] = {}
    for key in PIPELINE_PARAM_KEYS:
        family = key.split(".")[0]
        if family not in files:
            files[family] = _read_yaml(root / "params" / f"{family}.yaml")
        value = _dig(files[family], tuple(key.split(".")))
        if value is not None and not isinstance(value, (Mapping, list)):
            found[key] = value
    return found


def _metric_name_part(text: str) -> str:
    return re.sub(r"[^\w\-. ]", "_", text)  # MLflow's metric names: alphanumerics, _ - . space / :


def checkpoint_metrics(root: str | Path) -> dict[str, float]:
    """The headline metrics of every checkpoint in `root/metrics/{validate,ood_qa,toolstar}/<checkpoint>.json`, as
    `validate/sft/final_pass`, `ood_qa/rl/em`, `toolstar/rl/accuracy` (unreadable files and absent keys skipped)."""
    found: dict[str, float] = {}
    for folder, names in HEADLINE_METRICS.items():
        for path in sorted((Path(root) / "metrics" / folder).glob("*.json")):
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            for name, keys in names.items():
                value = _dig(data, keys)
                if isinstance(value, (int, float)) and not isinstance(value, bool) and value == value \
                        and abs(value) != float("inf"):
                    found[f"{folder}/{_metric_name_part(path.stem)}/{name}"] = float(value)
    return found


def log_checkpoint_metrics(run: Run, root: str | Path) -> None:
    """Log `checkpoint_metrics(root)` on `run` (spooled like any of its calls when MLflow is away)."""
    try:
        metrics = checkpoint_metrics(root)
    except Exception as exc:  # a summary never fails the pipeline
        print(f"[{run.label}] no checkpoint metrics: {describe_error(exc)}", file=sys.stderr)
        return
    if metrics:
        run.log_metrics(metrics)


def refresh_parent_summary(run: Run) -> None:
    """After a stage: log on its parent run the pipeline params it lacks and the checkpoint metrics that changed,
    both read from the stage's workspace. That sums up the parents that no flow ends: a plain `dvc repro`'s, and a
    sweep variant's, whose stages run in the experiment's own copy (`dvc exp run --temp`) with its overrides. Never
    fails the stage."""
    parent_id = run._summary_parent
    if not parent_id or run.offline:
        return
    try:
        client = _client()
        parent = client.get_run(parent_id).data
        root = workspace_root()
        missing = {k: v for k, v in redact(pipeline_params(root)).items() if k not in parent.params}
        if missing:
            _apply_params(client, parent_id, {"params": missing})
        changed = {k: v for k, v in checkpoint_metrics(root).items() if parent.metrics.get(k) != v}
        if changed:
            _apply_metrics(client, parent_id, {"metrics": changed, "step": 0, "timestamp": now_ms()})
    except Exception as exc:
        print(f"[{run.label}] the dvc repro run {parent_id} did not take the checkpoint metrics: "
              f"{describe_error(exc)}", file=sys.stderr)
