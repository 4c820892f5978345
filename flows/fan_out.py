"""A sweep's configurations as flow runs of a Prefect work pool (`towerbench sweep --pool`).

Each configuration becomes one run of the `train-config` deployment, taken by whichever
`towerbench worker` polls first. MLflow, not the Prefect state, says how a configuration ended: a
Completed flow run whose MLflow run did not finish counts as lost. A lost run (Crashed, or
Running on a worker that went offline) is given to another worker, up to MAX_ATTEMPTS times,
resuming from its checkpoint where the data folder is shared.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from prefect import get_run_logger
from prefect.client.orchestration import SyncPrefectClient, get_client
from prefect.client.schemas.objects import FlowRun, WorkerStatus
from prefect.deployments import run_deployment
from prefect.exceptions import ObjectNotFound
from prefect.states import Cancelling, Crashed

from flows.config_run import DEPLOYMENT_NAME
from model.errors import TowerbenchError
from model.params import TrackingConfig
from tasks.tracking import (
    DONE_STATUSES,
    ERROR_TAG,
    STATUS_TAG,
    UNSTABLE_TAG,
    WORKER_TAG,
    client_for,
    mark_failed,
    mark_killed,
)
from tasks.train_worker import WorkerRequest

MAX_ATTEMPTS = 3
POLL_SECONDS = 2.0
IDLE_WARNING_SECONDS = 60  # say so when nothing serves the pool for this long
STOPPED = "the sweep was stopped; run the same sweep again to resume"


@dataclass
class Job:
    """One configuration on its way through the pool."""

    index: int  # the configuration's place in the sweep
    request: WorkerRequest
    name: str
    attempt: int = 0
    flow_run_id: UUID | None = None


def _outcome(tracking: TrackingConfig, run_id: str) -> dict[str, Any]:
    """How the configuration's MLflow run ended (the source of truth)."""
    run = client_for(tracking).get_run(run_id)
    tags = run.data.tags
    outcome = {
        "status": tags.get(STATUS_TAG, "failed"),
        "test_accuracy": run.data.metrics.get("test_accuracy"),
        "worker": tags.get(WORKER_TAG),
    }
    if tags.get(UNSTABLE_TAG):
        outcome["unstable"] = tags[UNSTABLE_TAG]
    if outcome["status"] not in DONE_STATUSES:
        outcome["error"] = tags.get(ERROR_TAG, "the flow run failed; see its log in Prefect")
    return outcome


def _submit(job: Job) -> None:
    job.attempt += 1
    flow_run = run_deployment(
        DEPLOYMENT_NAME,
        parameters={
            "request": job.request.model_dump(mode="json"),
            "name": job.name,
            "attempt": job.attempt,
        },
        flow_run_name=f"{job.name} #{job.attempt}",
        timeout=0,
    )
    job.flow_run_id = flow_run.id


def _online_workers(client: SyncPrefectClient, pool: str) -> set[str]:
    return {
        worker.name
        for worker in client.read_workers_for_work_pool(pool)
        if worker.status == WorkerStatus.ONLINE
    }


def _lost(flow_run: FlowRun, online: set[str]) -> str | None:
    """Why a flow run will not finish by itself, or None while it may."""
    state = flow_run.state
    if state is None:
        return None
    if state.is_crashed() or state.is_cancelled():
        return f"{state.name.lower()}: {state.message or 'no message'}"
    worker = flow_run.labels.get("prefect.worker.name")
    if (state.is_running() or state.is_pending()) and worker and worker not in online:
        return f"worker {worker} went offline"
    return None


def run_on_pool(
    pool: str,
    jobs: list[Job],
    tracking: TrackingConfig,
    on_done: Callable[[Job, dict[str, Any]], None],
) -> None:
    """Submit every job to `pool` and follow them to the end; `on_done(job, outcome)` as each
    ends. Stopped (Ctrl-C, SIGTERM), it cancels the flow runs it leaves."""
    logger = get_run_logger()
    with get_client(sync_client=True) as client:
        try:
            client.read_deployment_by_name(DEPLOYMENT_NAME)
        except ObjectNotFound:
            raise TowerbenchError(
                f"no deployment {DEPLOYMENT_NAME} on this Prefect server: start a worker first "
                f"(`towerbench worker --pool {pool}`) on each host that should train"
            ) from None
        for job in jobs:
            _submit(job)
        logger.info("%d configurations submitted to work pool %r", len(jobs), pool)
        waiting = list(jobs)
        idle_since = time.monotonic()
        try:
            while waiting:
                time.sleep(POLL_SECONDS)
                online = _online_workers(client, pool)
                if online:
                    idle_since = time.monotonic()
                elif time.monotonic() - idle_since > IDLE_WARNING_SECONDS:
                    logger.warning(
                        "no worker serves pool %r: `towerbench worker --pool %s`", pool, pool
                    )
                    idle_since = time.monotonic()
                for job in list(waiting):
                    flow_run = client.read_flow_run(job.flow_run_id)
                    state = flow_run.state
                    lost = _lost(flow_run, online)
                    if state is not None and (state.is_completed() or state.is_failed()):
                        outcome = _outcome(tracking, job.request.run_id)
                        if state.is_completed() and outcome["status"] not in DONE_STATUSES:
                            lost = "completed in Prefect, not in MLflow"
                        else:
                            waiting.remove(job)
                            on_done(job, outcome)
                            continue
                    if lost is None:
                        continue
                    client.set_flow_run_state(job.flow_run_id, Crashed(message=lost), force=True)
                    if job.attempt >= MAX_ATTEMPTS:
                        error = f"lost {job.attempt} times on pool {pool!r}; the last: {lost}"
                        mark_failed(tracking, job.request.run_id, error)
                        waiting.remove(job)
                        on_done(job, {"status": "failed", "error": error})
                        continue
                    logger.warning("%s attempt %d %s: submitted again", job.name, job.attempt, lost)
                    _submit(job)
        except BaseException:
            for job in waiting:  # the workers stop them; their runs keep their checkpoints
                client.set_flow_run_state(job.flow_run_id, Cancelling(message=STOPPED), force=True)
                mark_killed(tracking, job.request.run_id, STOPPED)
            raise
