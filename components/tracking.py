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
points boto3 at any S3-compatible store). Secrets never reach MLflow: params and tags whose key names a secret, any
value containing a secret from the environment, and URL passwords and tokens (`components.redact`) are redacted.
"""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components.environ import snapshot as environ_snapshot
from components.redact import REDACTED, is_secret_key, redact_url

PARENT_RUN_ENV = "STAR_PARENT_RUN_ID"
EXPERIMENT_ENV = "STAR_EXPERIMENT"
PRESET_ENV = "STAR_PRESET"
VARIANT_ENV = "STAR_VARIANT"
MODEL_ALIAS = "candidate"
_EXPS_TMP = os.path.join(".dvc", "tmp", "exps")
_MAX_PARAM_LENGTH = 6000  # MLflow's limit on a param value


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
    from components.orchestration.presets import active_preset as recorded

    return recorded(repo_root(root) / "params")


def experiment_name(root: str | Path | None = None) -> str:
    """`STAR_EXPERIMENT`, else `star-<preset>`, else `star`."""
    if os.environ.get(EXPERIMENT_ENV):
        return os.environ[EXPERIMENT_ENV]
    preset = active_preset(root)
    return f"star-{preset}" if preset else "star"


def default_artifact_location() -> str | None:
    """Artifacts of a local sqlite store go to `<repo root>/mlruns` (absolute); servers decide for themselves."""
    if tracking_uri().startswith("sqlite:"):
        return (repo_root() / "mlruns").as_uri()
    return None


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
    """Stringified values with secrets replaced by `***` (by key name, by known secret value, URL passwords and
    tokens)."""
    secrets = secret_values(environ)
    clean: dict[str, str] = {}
    for key, value in flat.items():
        text = json.dumps(value) if isinstance(value, (list, dict)) else str(value)
        if is_secret_key(key) and value not in (None, "", False):
            text = REDACTED
        for secret in secrets:
            text = text.replace(secret, REDACTED)
        text = redact_url(text)
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


# ---------------------------------------------------------------- runs

def _client():
    from mlflow.tracking import MlflowClient

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
    import fcntl

    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{path}.lock", "a") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            SqlAlchemyStore(uri, (path.parent / "mlruns").as_uri())  # creates and migrates the tables
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)
    _READY_STORES.add(uri)


_READY_STORES: set[str] = set()


def ensure_experiment(name: str) -> str:
    """The id of experiment `name`, created if absent (safe when several stage processes race to create it)."""
    from mlflow.exceptions import MlflowException

    client = _client()
    for _ in range(5):
        found = client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        try:
            return client.create_experiment(name, artifact_location=default_artifact_location())
        except MlflowException:
            time.sleep(0.2)  # another process created it between our two calls
    raise RuntimeError(f"could not create or find MLflow experiment '{name}' at {redact_url(tracking_uri())}")


@dataclass
class Run:
    """An open MLflow run addressed by id (safe to use from threads: no reliance on the active run)."""

    run_id: str
    experiment_id: str

    def log_params(self, params: Any) -> None:
        """Log params flattened to dotted keys, secrets redacted."""
        from mlflow.entities import Param

        flat = redact(flatten(params))
        items = [Param(key, value) for key, value in flat.items()]
        for start in range(0, len(items), 100):
            _client().log_batch(self.run_id, params=items[start:start + 100])

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        """Log numeric metrics (nested dicts flattened to dotted names) at `step`."""
        from mlflow.entities import Metric

        stamp = int(time.time() * 1000)
        items = [Metric(key, float(value), stamp, step or 0) for key, value in flatten(dict(metrics)).items()
                 if isinstance(value, (int, float)) and not isinstance(value, bool)]
        if items:
            _client().log_batch(self.run_id, metrics=items)

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        """Set tags (values redacted like params)."""
        from mlflow.entities import RunTag

        clean = redact(dict(tags))
        _client().log_batch(self.run_id, tags=[RunTag(k, v) for k, v in clean.items()])

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        """Upload a file, or a folder's contents, as artifacts of this run."""
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"cannot log artifact {path}: it does not exist")
        if path.is_dir():
            _client().log_artifacts(self.run_id, str(path), artifact_path=artifact_path or path.name)
        else:
            _client().log_artifact(self.run_id, str(path), artifact_path=artifact_path)

    def log_dict(self, data: Any, artifact_file: str) -> None:
        """Store a JSON-serialisable object as an artifact file."""
        _client().log_dict(self.run_id, data, artifact_file)

    def log_model(self, model_dir: str | Path, registered_name: str | None = None,
                  alias: str = MODEL_ALIAS) -> int | None:
        """Log a Hugging Face model folder as artifacts under `model/`; register a version with `alias` if asked.

        Returns the registered version number, or None when not registered.
        """
        model_dir = Path(model_dir)
        if not (model_dir / "config.json").exists():
            raise FileNotFoundError(f"{model_dir} is not a Hugging Face model folder (no config.json)")
        client = _client()
        client.log_artifacts(self.run_id, str(model_dir), artifact_path="model")
        if not registered_name:
            return None
        from mlflow.exceptions import MlflowException

        try:
            client.create_registered_model(registered_name)
        except MlflowException:
            pass  # already registered: add a version
        source = f"{client.get_run(self.run_id).info.artifact_uri}/model"
        version = client.create_model_version(registered_name, source, run_id=self.run_id)
        client.set_registered_model_alias(registered_name, alias, version.version)
        return int(version.version)


@contextlib.contextmanager
def stage_run(stage: str, params: Any = None, tags: Mapping[str, Any] | None = None) -> Iterator[Run]:
    """Open the MLflow run of one stage: a child of `STAR_PARENT_RUN_ID` when set, else a top-level run.

    The run is the process's active run (so library callbacks log into it); it ends FAILED if the body raises.
    """
    import mlflow

    ensure_sqlite_store(tracking_uri())
    with _process_tracking_uri(tracking_uri()):
        with _active_stage_run(mlflow, stage, params, tags) as run:
            yield run


@contextlib.contextmanager
def _process_tracking_uri(uri: str) -> Iterator[None]:
    """mlflow's process-wide tracking URI set to `uri` for the body, then put back as it was.

    `mlflow.set_tracking_uri` is global (it also writes `MLFLOW_TRACKING_URI`): left set, it would send every later
    `MlflowClient()` of a long-lived process (a notebook, a test session) to this run's store.
    """
    import mlflow
    from mlflow.tracking._tracking_service import utils

    previous, previous_env = utils._tracking_uri, os.environ.get("MLFLOW_TRACKING_URI")
    mlflow.set_tracking_uri(uri)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(previous)  # None also removes MLFLOW_TRACKING_URI
        if previous_env is not None:
            os.environ["MLFLOW_TRACKING_URI"] = previous_env


@contextlib.contextmanager
def _active_stage_run(mlflow, stage: str, params: Any, tags: Mapping[str, Any] | None) -> Iterator[Run]:
    """The body of `stage_run`, once the tracking URI is in place."""
    parent_id = os.environ.get(PARENT_RUN_ENV) or None
    if parent_id:
        experiment_id = _client().get_run(parent_id).info.experiment_id
    else:
        experiment_id = ensure_experiment(experiment_name())
    all_tags = {**context_tags(stage), **dict(tags or {})}
    active = mlflow.start_run(experiment_id=experiment_id, run_name=stage, parent_run_id=parent_id,
                              nested=parent_id is not None, tags=redact(all_tags))
    run = Run(active.info.run_id, experiment_id)
    print(f"[{stage}] MLflow run {run.run_id} in experiment '{experiment_name()}' at "
          f"{redact_url(tracking_uri())}" + (f" (parent {parent_id})" if parent_id else ""), file=sys.stderr)
    if params is not None:
        run.log_params(params)
    try:
        yield run
    except BaseException:
        mlflow.end_run(status="FAILED")
        raise
    mlflow.end_run(status="FINISHED")


@dataclass
class PipelineRun(Run):
    """The parent run of a pipeline or sweep: stages report what happened to them here."""

    def env(self) -> dict[str, str]:
        """Environment for stage processes: the parent id and an absolute tracking URI."""
        return {PARENT_RUN_ENV: self.run_id, "MLFLOW_TRACKING_URI": tracking_uri(),
                EXPERIMENT_ENV: experiment_name()}

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
        self.set_tags(tags)
        if seconds is not None:
            self.log_metrics({f"stage_seconds.{safe}": seconds})
        if lock_hash and status == "ran":
            for child in child_runs(self.run_id, stage):
                Run(child.info.run_id, self.experiment_id).set_tags({"dvc.lock_hash": lock_hash})


def child_runs(parent_run_id: str, stage: str | None = None) -> list:
    """The child runs of a parent (optionally only those of one DVC stage address like `validate@sft`)."""
    client = _client()
    parent = client.get_run(parent_run_id)
    query = f"tags.mlflow.parentRunId = '{parent_run_id}'"
    if stage:
        query += f" and tags.`dvc.stage` = '{stage}'"
    return client.search_runs([parent.info.experiment_id], filter_string=query, max_results=1000)


@contextlib.contextmanager
def pipeline_run(name: str, params: Any = None, tags: Mapping[str, Any] | None = None,
                 parent_run_id: str | None = None) -> Iterator[PipelineRun]:
    """Create the parent run of a pipeline (or a sweep variant, when `parent_run_id` is given).

    Uses explicit run ids only, so Prefect tasks in threads can log to it. Ends FAILED if the body raises.
    """
    client = _client()
    if parent_run_id:
        experiment_id = client.get_run(parent_run_id).info.experiment_id
    else:
        experiment_id = ensure_experiment(experiment_name())
    all_tags = {"mlflow.runName": name, **context_tags(), **dict(tags or {})}
    if parent_run_id:
        all_tags["mlflow.parentRunId"] = parent_run_id
    created = client.create_run(experiment_id, tags=redact(all_tags), run_name=name)
    run = PipelineRun(created.info.run_id, experiment_id)
    print(f"MLflow parent run {run.run_id} ('{name}') in experiment '{experiment_name()}' at "
          f"{redact_url(tracking_uri())}", file=sys.stderr)
    if params is not None:
        run.log_params(params)
    try:
        yield run
    except BaseException:
        client.set_terminated(run.run_id, status="FAILED")
        raise
    client.set_terminated(run.run_id, status="FINISHED")
