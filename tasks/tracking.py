"""MLflow bookkeeping: where runs go, the sweep's parent run and one nested run per configuration.

Runs are created with an explicit `MlflowClient` rather than the thread-local "active run", so
tasks running in Prefect's worker threads and training processes never attach to the wrong run.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import socket
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
import numpy as np
import psutil
from mlflow.data.dataset import Dataset
from mlflow.data.numpy_dataset import from_numpy
from mlflow.entities import DatasetInput, InputTag, Param, Run, RunStatus, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT, MLFLOW_RUN_NAME

from towerbench.config.losses import user_code
from towerbench.config.model_ref import model_label
from towerbench.config.optimizers import adascale_power
from towerbench.config.params import SWEEP_AXES, TrackingConfig
from towerbench.config.sections import TrainConfig
from towerbench.config.tracking_uri import check_store_exists
from towerbench.core.errors import TowerbenchError
from towerbench.core.outcome import Outcome, Status
from towerbench.core.tfrecord_format import MANIFEST_NAME, dataset_dir, load_manifest
from towerbench.tasks.preflight import MLFLOW_PROBE
from towerbench.tasks.sweep_lock import config_key
from towerbench.tasks.sweep_lock import sweep_key as sweep_key  # read from here too

KIND_TAG = "towerbench.kind"  # "sweep" on parent runs, "config" on each configuration's run
FLOW_TAG = "towerbench.flow"  # which flow made a sweep: "sweep", "pipeline", "nightly" or "advise"
STATUS_TAG = "towerbench.status"  # a core.outcome.Status
ERROR_TAG = "towerbench.error"
CONFIG_TAG = "towerbench.config"  # the run's TrainConfig as JSON, to rebuild it exactly
GROUP_TAG = "towerbench.group"  # the configuration without its seed
DATA_VERSION_TAG = "towerbench.data_version"
# The folder a run read its data from (on a pool, the worker's: MLflow keeps a dataset's first
# source, the sweep's, for every run that logs the same name and version).
DATA_DIR_TAG = "towerbench.data_dir"
UNSTABLE_TAG = "towerbench.unstable"  # why a completed run counts as unstable (learning collapsed)
DIVERGED_TAG = "towerbench.diverged"  # why a run stopped as diverged (its MLflow status FAILED)
# JSON list of the training fields a sweep varies: its axes given several values, then its grid's
# fields (before 2026-12 the grid's alone; readers take the grid's with `swept_besides_axes`).
SWEPT_TAG = "towerbench.swept"
SWEEP_KEY_TAG = "towerbench.sweep_key"  # what a sweep trains, on which data: resume finds it
SWEEP_PARTS_TAG = "towerbench.sweep_parts"  # the key's parts (tasks/sweep_lock.py:sweep_parts)
# The process that closes a run (host:pid:start time): a run RUNNING whose owner is gone was
# left by a dead attempt; the next sweep or advise closes it KILLED, naming what replaced it.
OWNER_TAG = "towerbench.owner"
REPLACED_BY_TAG = "towerbench.replaced_by"
# Where a pool's worker ran a configuration (`towerbench sweep --pool`).
HOST_TAG = "towerbench.host"
WORKER_TAG = "towerbench.worker"
DEVICES_TAG = "towerbench.devices"
FLOW_RUN_TAG = "towerbench.flow_run_id"
ATTEMPT_TAG = "towerbench.attempt"
PARENT_TAG = "mlflow.parentRunId"
# MLflow 3 declares what an experiment is for with this tag (the training kind shows runs first).
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
TRAINING = "custom_model_development"
# The 3.17 UI opens experiments by the browser's "GenAI | Model training" switch (default GenAI,
# whatever the tag says); this query parameter sets it, so our links land on the training runs.
TRAINING_VIEW = "?workflowType=machine_learning"
# MLflow 3.17 keeps the runs table's columns per browser; a "shared view" (an experiment tag the UI
# reads when a link names its key) opens it on what a sweep compares. The UI says it is shared;
# "Override saved view" keeps it, "Exit shared view" returns to the browser's own.
SHARED_VIEW_TAG = "mlflow.sharedViewState."
RUNS_VIEW_KEY = "towerbench"
RUNS_VIEW = {
    "selectedColumns": [
        *(f"params.`{name}`" for name in ("towers", "workers", "lr_scaling", "warmup_epochs")),
        *(f"params.`{name}`" for name in ("aggregation", "seed", "global_batch")),
        "params.`effective.metric`",  # what test_metric is: accuracy, mae, ...
        *(f"metrics.`{name}`" for name in ("test_metric", "images_per_sec")),
    ]
}
RUNS_LINK = f"{TRAINING_VIEW}&viewStateShareKey={RUNS_VIEW_KEY}"


class TrackingServerLost(TowerbenchError):
    """The tracking server stopped answering mid-command: nothing was wrong with the input, a
    run could not go on (exit status 1); the same command resumes once it answers again."""

    exit_status = 1


# How long the tracking server has to answer once a request to it failed.
LOST_SERVER_SECONDS = 5.0


@contextlib.contextmanager
def tracking_server_watched(tracking: TrackingConfig) -> Iterator[None]:
    """Raise an MLflow failure in the block as `TrackingServerLost` (one line) when the
    tracking server has stopped answering; as itself otherwise."""
    try:
        yield
    except MlflowException:
        uri = tracking.tracking_uri or ""
        if not uri.startswith(("http://", "https://")):
            raise
        try:
            httpx.get(uri.rstrip("/") + MLFLOW_PROBE, timeout=LOST_SERVER_SECONDS)
        except httpx.HTTPError as lost:
            raise TrackingServerLost(
                f"lost the MLflow tracking server {uri} ({lost or type(lost).__name__}); the "
                "runs keep their checkpoints: once it answers, run the same command again to "
                "resume"
            ) from None
        raise


# SQLite stores this process found complete (a created schema never becomes incomplete again).
_READY_STORES: set[str] = set()


def ensure_store(tracking_uri: str) -> None:
    """Let one process at a time create a new SQLite store's schema (a lock file beside it).

    MLflow creates the tables and runs its migrations on first use; two processes doing that on
    the same new file at once crash ("table ... already exists", alembic "expected to match one
    row"). Tracking servers and other databases are left to MLflow.
    """
    if not tracking_uri.startswith("sqlite:///") or tracking_uri in _READY_STORES:
        return
    database = Path(tracking_uri.removeprefix("sqlite:///"))
    database.parent.mkdir(parents=True, exist_ok=True)
    with open(database.with_name(database.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        MlflowClient(tracking_uri=tracking_uri).search_experiments(max_results=1)
    _READY_STORES.add(tracking_uri)


def client_for(tracking: TrackingConfig) -> MlflowClient:
    ensure_store(tracking.tracking_uri or "")
    return MlflowClient(tracking_uri=tracking.tracking_uri)


def existing_store_client(tracking: TrackingConfig) -> MlflowClient:
    """A client of a store that holds runs already (to read a sweep back): a SQLite file that
    is not there is a one-line error, never a new empty store."""
    check_store_exists(tracking.tracking_uri)
    return client_for(tracking)


def experiment_name(tracking: TrackingConfig, config: TrainConfig) -> str:
    return tracking.experiment or f"towerbench-{config.dataset}-{model_label(config.model)}"


def ensure_experiment(tracking: TrackingConfig, name: str) -> str:
    """The id of experiment `name`, created (with the configured artifact root) if missing,
    declared a model-training experiment unless someone chose another kind in the UI, with the
    runs view that RUNS_LINK opens unless someone saved another under its key."""
    tags = {EXPERIMENT_KIND_TAG: TRAINING, SHARED_VIEW_TAG + RUNS_VIEW_KEY: json.dumps(RUNS_VIEW)}
    client = client_for(tracking)
    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        try:
            return client.create_experiment(
                name, artifact_location=tracking.artifact_root, tags=tags
            )
        except MlflowException:
            experiment = client.get_experiment_by_name(name)  # a sweep started beside us made it
            if experiment is None:
                raise
    for key, value in tags.items():
        if key not in experiment.tags:
            client.set_experiment_tag(experiment.experiment_id, key, value)
    return experiment.experiment_id


def runs_url(tracking: TrackingConfig, experiment_id: str) -> str:
    """Link to an experiment's runs in the MLflow UI, on the columns a sweep compares."""
    return f"{_ui_base(tracking)}/#/experiments/{experiment_id}/runs{RUNS_LINK}"


def flat_params(values: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested config values as MLflow params (`grid.epochs` style keys, lists as JSON)."""
    flat: dict[str, str] = {}
    for key, value in values.items():
        if isinstance(value, dict):
            flat.update(flat_params(value, f"{prefix}{key}."))
        elif value is not None and not isinstance(value, str | int | float | bool):
            flat[prefix + key] = json.dumps(value)
        else:
            flat[prefix + key] = str(value)
    return flat


def swept_besides_axes(run: Run) -> list[str]:
    """The training fields a sweep varied besides its named axes: what its run names add."""
    swept = json.loads(run.data.tags.get(SWEPT_TAG, "[]"))
    return [name for name in swept if name not in SWEEP_AXES]


def dataset_input(data_dir: Path, dataset: str, data_version: str) -> Dataset:
    """The dataset as MLflow records it, with its data version (the DVC content hash) as the
    digest."""
    folder = dataset_dir(data_dir, dataset)
    manifest = load_manifest(folder)
    # A one-example placeholder: MLflow profiles the array; the digest identifies the data.
    placeholder = np.zeros([1, *manifest.image_shape], dtype=manifest.dtype)
    # MLflow digests hold at most 36 characters: a DVC `<md5>.dir` fits, a prefixed one is cut.
    digest = data_version if len(data_version) <= 36 else data_version.rsplit(":", 1)[-1][:36]
    with warnings.catch_warnings():
        # MLflow registers two resolvers of local paths, warns that they overlap and takes one.
        warnings.filterwarnings("ignore", message="The specified dataset source can be interpreted")
        return from_numpy(placeholder, source=str(folder.resolve()), name=dataset, digest=digest)


def log_sweep_inputs(
    tracking: TrackingConfig, run_id: str, data_dir: Path, versions: dict[str, str]
) -> None:
    """Record a sweep's datasets (name -> data version) as its parent run's training inputs, as
    each configuration's run records its own (MLflow's Datasets column)."""
    context = InputTag(MLFLOW_DATASET_CONTEXT, "training")
    inputs = [
        DatasetInput(dataset_input(data_dir, name, version)._to_mlflow_entity(), tags=[context])
        for name, version in versions.items()
        if (dataset_dir(data_dir, name) / MANIFEST_NAME).is_file()
    ]
    if inputs:
        client_for(tracking).log_inputs(run_id, datasets=inputs)


def log_params(client: MlflowClient, run_id: str, params: dict[str, str]) -> None:
    items = [Param(key, value) for key, value in params.items()]
    for start in range(0, len(items), 100):  # MLflow's batch limit
        client.log_batch(run_id, params=items[start : start + 100])


def newest_unfinished(
    tracking: TrackingConfig, experiment_id: str, tag: str, value: str
) -> Run | None:
    """The newest run tagged `tag` = `value` that did not finish (crashed, killed, stopped)."""
    runs = client_for(tracking).search_runs(
        [experiment_id],
        filter_string=f"tags.`{tag}` = '{value}' and attributes.status != 'FINISHED'",
        order_by=["attributes.start_time DESC"],
        max_results=1,
    )
    return runs[0] if runs else None


def unfinished_sweep(tracking: TrackingConfig, experiment_id: str, key: str) -> str | None:
    """The newest parent run of sweep `key` that did not finish."""
    run = newest_unfinished(tracking, experiment_id, SWEEP_KEY_TAG, key)
    return run.info.run_id if run is not None else None


def sweep_children(tracking: TrackingConfig, parent_run_id: str) -> dict[str, Run]:
    """config_key -> run, for a sweep's configuration runs."""
    client = client_for(tracking)
    parent = client.get_run(parent_run_id)
    children = client.search_runs(
        [parent.info.experiment_id],
        filter_string=children_filter(parent_run_id),
        max_results=5000,
    )
    return {
        config_key(TrainConfig.from_stored(run.data.tags[CONFIG_TAG])): run
        for run in children
        if CONFIG_TAG in run.data.tags
    }


def reopen_run(tracking: TrackingConfig, run_id: str, status: Status | None = None) -> None:
    """Mark a run of an interrupted sweep RUNNING again, without its old error."""
    client = client_for(tracking)
    if ERROR_TAG in client.get_run(run_id).data.tags:
        client.delete_tag(run_id, ERROR_TAG)
    if status is not None:
        client.set_tag(run_id, STATUS_TAG, status)
    client.set_tag(run_id, OWNER_TAG, this_process())
    client.update_run(run_id, status=RunStatus.to_string(RunStatus.RUNNING))


def this_process() -> str:
    """This process as OWNER_TAG records it: host, pid and start time (a pid is reused)."""
    process = psutil.Process()
    return f"{socket.gethostname()}:{process.pid}:{process.create_time():.2f}"


def owner_gone(run: Run) -> bool:
    """Whether the process that owns `run` (OWNER_TAG) has ended; False when unknown (no tag,
    or a process of another host, which cannot be seen from here)."""
    host, _, process = run.data.tags.get(OWNER_TAG, "").partition(":")
    if host != socket.gethostname():
        return False
    pid, _, started = process.partition(":")
    try:
        return f"{psutil.Process(int(pid)).create_time():.2f}" != started
    except psutil.NoSuchProcess:
        return True


def close_dead_runs(tracking: TrackingConfig, experiment_id: str, replaced_by: str) -> int:
    """Close the runs of `experiment_id` that a dead attempt left RUNNING (their owner gone):
    KILLED, tagged with the run that replaced them (`replaced_by`, the run this process now
    owns); how many."""
    client = client_for(tracking)
    running = client.search_runs(
        [experiment_id], filter_string="attributes.status = 'RUNNING'", max_results=5000
    )
    dead = [run for run in running if run.info.run_id != replaced_by and owner_gone(run)]
    reason = f"its process ended without closing it; replaced by run {replaced_by}"
    for run in dead:
        tags = [RunTag(REPLACED_BY_TAG, replaced_by), RunTag(ERROR_TAG, reason)]
        if run.data.tags.get(KIND_TAG) == "config":
            tags.append(RunTag(STATUS_TAG, Status.FAILED))
        client.log_batch(run.info.run_id, tags=tags)
        client.set_terminated(run.info.run_id, RunStatus.to_string(RunStatus.KILLED))
    return len(dead)


def claim_run(tracking: TrackingConfig, run_id: str) -> None:
    """Record this process as the owner of `run_id`, and close what dead attempts left RUNNING
    in its experiment (replaced by it)."""
    client = client_for(tracking)
    client.set_tag(run_id, OWNER_TAG, this_process())
    close_dead_runs(tracking, client.get_run(run_id).info.experiment_id, run_id)


def last_sweep(tracking: TrackingConfig, experiment_id: str, flow: str) -> Run | None:
    """The newest parent run of a `flow` sweep in the experiment."""
    runs = client_for(tracking).search_runs(
        [experiment_id],
        filter_string=f"tags.`{KIND_TAG}` = 'sweep' and tags.`{FLOW_TAG}` = '{flow}'",
        order_by=["attributes.start_time DESC"],
        max_results=1,
    )
    return runs[0] if runs else None


def start_sweep_run(
    tracking: TrackingConfig,
    experiment_id: str,
    name: str,
    flow: str,
    params: dict[str, Any],
    swept: list[str],
    key: str,
    parts: dict[str, Any] | None = None,
) -> str:
    """Create the parent run of a sweep and return its id."""
    client = client_for(tracking)
    tags = {
        KIND_TAG: "sweep",
        FLOW_TAG: flow,
        SWEPT_TAG: json.dumps(swept),
        SWEEP_KEY_TAG: key,
        OWNER_TAG: this_process(),
    }
    if parts is not None:
        tags[SWEEP_PARTS_TAG] = json.dumps(parts)
    run = client.create_run(experiment_id, run_name=name, tags=tags)
    log_params(client, run.info.run_id, flat_params(params))
    return run.info.run_id


def effective_optimizer(config: TrainConfig) -> dict[str, float | str]:
    """The optimizer's hyperparameters as the run uses them (its scaling rule applied), under
    AdaScale the power of the gain in the LR, and under the EMA rule its scale and EMA decay."""
    values: dict[str, float | str] = {"optimizer": config.optimizer}
    values.update(config.optimizer_hyperparameters().items())
    if config.lr_scaling == "adascale":
        values["adascale_power"] = adascale_power(config.optimizer)
    if config.ema_scaling == "ema_rule":  # BatchNorm's momentum m is m ** ema_scale too
        values["ema_scale"] = config.ema_scale
        values["ema_decay"] = config.scaled_momentum(config.ema_decay)
    return values


def create_config_run(
    tracking: TrackingConfig,
    experiment_id: str,
    parent_run_id: str,
    config: TrainConfig,
    name: str,
    group: str,
    data_version: str,
    extra: dict[str, str] | None = None,
) -> str:
    """Create the nested run of one configuration, with every config field as a param (and
    `extra` ones: its budget)."""
    client = client_for(tracking)
    run = client.create_run(
        experiment_id,
        run_name=name,
        tags={
            PARENT_TAG: parent_run_id,
            KIND_TAG: "config",
            STATUS_TAG: Status.RUNNING,
            GROUP_TAG: group,
            CONFIG_TAG: config.model_dump_json(),
            DATA_VERSION_TAG: data_version,
            OWNER_TAG: this_process(),
        },
    )
    params = flat_params(config.model_dump(mode="json"))
    params.update(flat_params({"effective": effective_optimizer(config)}))
    params["data_version"] = data_version
    params.update(user_code(config.model, config.loss))
    params.update(extra or {})
    log_params(client, run.info.run_id, params)
    return run.info.run_id


def run_outcome(run: Run) -> Outcome:
    """How a configuration's run ended, as the sweep summarises it: status, the metric it is
    judged by and its test value (and test accuracy), the pool worker that ran it, why it is
    unstable or failed."""
    tags, metrics = run.data.tags, run.data.metrics
    steps = metrics.get("steps")
    return Outcome(
        status=tags.get(STATUS_TAG, Status.FAILED),
        metric=run.data.params.get("effective.metric"),
        test_metric=metrics.get("test_metric"),
        test_accuracy=metrics.get("test_accuracy"),
        epochs=metrics.get("epochs"),
        steps=int(steps) if steps is not None else None,
        worker=tags.get(WORKER_TAG),
        unstable=tags.get(UNSTABLE_TAG) or None,
        error=tags.get(ERROR_TAG) or None,
    )


def set_tags(tracking: TrackingConfig, run_id: str, tags: dict[str, str]) -> None:
    client_for(tracking).log_batch(run_id, tags=[RunTag(key, value) for key, value in tags.items()])


def mark_failed(tracking: TrackingConfig, run_id: str, error: str, log: str = "") -> None:
    """Record a configuration that crashed (or was killed) and close its run as FAILED, with
    the training process's log as an artifact."""
    client = client_for(tracking)
    if log:
        client.log_text(run_id, log, "training_process.log")
    client.log_batch(
        run_id, tags=[RunTag(STATUS_TAG, Status.FAILED), RunTag(ERROR_TAG, error[:5000])]
    )
    client.set_terminated(run_id, RunStatus.to_string(RunStatus.FAILED))


def mark_killed(tracking: TrackingConfig, run_id: str, reason: str) -> None:
    """A run stopped from outside (Ctrl-C, SIGTERM, its sweep gone): KILLED, with the reason."""
    client = client_for(tracking)
    client.log_batch(run_id, tags=[RunTag(STATUS_TAG, Status.FAILED), RunTag(ERROR_TAG, reason)])
    client.set_terminated(run_id, RunStatus.to_string(RunStatus.KILLED))


def finish_sweep_run(tracking: TrackingConfig, run_id: str, status: str) -> None:
    """Close a sweep's parent run: FINISHED, FAILED or KILLED."""
    client_for(tracking).set_terminated(run_id, status)


def run_url(tracking: TrackingConfig, experiment_id: str, run_id: str) -> str:
    """Link to a run in the MLflow UI (a tracking server's own address when there is one)."""
    return f"{_ui_base(tracking)}/#/experiments/{experiment_id}/runs/{run_id}{TRAINING_VIEW}"


def children_filter(parent_run_id: str) -> str:
    """MLflow's search filter for a sweep's configuration runs."""
    return f"tags.`{PARENT_TAG}` = '{parent_run_id}'"


def sweep_charts_url(tracking: TrackingConfig, experiment_id: str, parent_run_id: str) -> str:
    """Link to MLflow's charts of a sweep's configuration runs. The UI nests child runs under a
    parent row (its charts then plot and name the parents) unless the runs are filtered and
    sorted by something other than their start: this link filters on the parent, sorts by name."""
    query = {
        "compareRunsMode": "CHART",
        "searchFilter": children_filter(parent_run_id),
        "orderByKey": f"tags.`{MLFLOW_RUN_NAME}`",
        "orderByAsc": "true",
    }
    return f"{runs_url(tracking, experiment_id)}&{urlencode(query)}"


def _ui_base(tracking: TrackingConfig) -> str:
    """The MLflow UI's address: a tracking server's own, else the configured UI's."""
    uri = tracking.tracking_uri or ""
    base = uri if uri.startswith(("http://", "https://")) else tracking.ui_url
    return base.rstrip("/")
