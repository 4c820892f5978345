"""A sweep's configurations as flow runs of a Prefect work pool (`towerbench sweep --pool`).

Each configuration becomes one run of the pool's `train-config` deployment, taken by whichever
`towerbench worker` polls first. MLflow, not the Prefect state, says how a configuration ended.
A lost run (Crashed, Running on a worker that went offline, Pending on no worker for too long)
is submitted again, up to MAX_ATTEMPTS times; the MLflow run records which attempt owns it, so
an earlier attempt that still runs somewhere cannot write over it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast
from uuid import UUID

from prefect import get_run_logger
from prefect.client.orchestration import SyncPrefectClient, get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
from prefect.client.schemas.objects import FlowRun, WorkerStatus
from prefect.deployments import run_deployment
from prefect.exceptions import ObjectNotFound
from prefect.states import Cancelling, Crashed

from towerbench.config.params import TrackingConfig
from towerbench.core.errors import TowerbenchError
from towerbench.core.outcome import Outcome, Status
from towerbench.flows.config_run import deployment_name
from towerbench.tasks.tracking import (
    ATTEMPT_TAG,
    client_for,
    mark_failed,
    mark_killed,
    run_outcome,
    set_tags,
)
from towerbench.tasks.training.worker import WorkerRequest

MAX_ATTEMPTS = 3
POLL_SECONDS = 2.0
IDLE_WARNING_SECONDS = 60  # say so when nothing serves the pool for this long
# A worker that stops between claiming a run and labelling it leaves it Pending on nobody.
UNCLAIMED_PENDING_SECONDS = 120
STOPPED = "the sweep was stopped; run the same sweep again to resume"


@dataclass
class Job:
    """One configuration on its way through the pool."""

    index: int  # the configuration's place in the sweep
    request: WorkerRequest
    name: str
    attempt: int = 0
    flow_run_id: UUID | None = None  # its latest attempt's, once submitted
    pending_unclaimed_since: float | None = None

    @property
    def submitted_run_id(self) -> UUID:
        """The flow run of its latest attempt (`_follow` follows submitted jobs only)."""
        if self.flow_run_id is None:
            raise RuntimeError(f"{self.name} was never submitted")
        return self.flow_run_id


def check_served(pool: str) -> None:
    """Refuse a pool no worker has registered the deployment for, before any run is opened."""
    with get_client(sync_client=True) as client:
        try:
            client.read_deployment_by_name(deployment_name(pool))
        except ObjectNotFound:
            raise TowerbenchError(
                f"--pool {pool}: no worker has served this pool yet; start one on each host that "
                f"should train (`towerbench worker --pool {pool}`, PREFECT_API_URL set)"
            ) from None


def _outcome(tracking: TrackingConfig, run_id: str) -> Outcome:
    return run_outcome(client_for(tracking).get_run(run_id))


def _submit(pool: str, job: Job, tracking: TrackingConfig) -> None:
    job.attempt += 1
    set_tags(tracking, job.request.run_id, {ATTEMPT_TAG: str(job.attempt)})  # the run's owner
    # Prefect's dispatcher returns a coroutine only to async callers; this one is synchronous.
    flow_run = cast(
        FlowRun,
        run_deployment(
            deployment_name(pool),
            parameters={
                "request": job.request.model_dump(mode="json"),
                "name": job.name,
                "attempt": job.attempt,
            },
            flow_run_name=f"{job.name} #{job.attempt}",
            timeout=0,
        ),
    )
    job.flow_run_id = flow_run.id
    job.pending_unclaimed_since = None


def _online_workers(client: SyncPrefectClient, pool: str) -> set[str]:
    return {
        worker.name
        for worker in client.read_workers_for_work_pool(pool)
        if worker.status == WorkerStatus.ONLINE
    }


def _lost(job: Job, flow_run: FlowRun, online: set[str]) -> str | None:
    """Why a flow run will not finish by itself, or None while it may."""
    state = flow_run.state
    if state is None:
        return None
    if state.is_crashed():
        return f"crashed: {state.message or 'no message'}"
    worker = flow_run.labels.get("prefect.worker.name")
    if (state.is_running() or state.is_pending()) and worker and worker not in online:
        return f"worker {worker} went offline"
    if state.is_pending() and not worker:
        job.pending_unclaimed_since = job.pending_unclaimed_since or time.monotonic()
        if time.monotonic() - job.pending_unclaimed_since > UNCLAIMED_PENDING_SECONDS:
            return f"pending on no worker for {UNCLAIMED_PENDING_SECONDS} s"
    return None


def _ended(job: Job, flow_run: FlowRun, tracking: TrackingConfig) -> Outcome | None:
    """The configuration's outcome once its flow run ended for good, else None."""
    state = flow_run.state
    if state is None or not (state.is_final() and not state.is_crashed()):
        return None
    outcome = _outcome(tracking, job.request.run_id)
    if outcome.status != Status.RUNNING:
        return outcome
    # It ended before the worker could record anything (an import error, MLflow refusing it).
    if state.is_cancelled():
        why = "was cancelled"
    elif state.is_failed():
        why = f"failed: {state.message or 'no message'}"
    else:
        why = "completed without recording a result"
    error = f"flow run {flow_run.name} {why}"
    if state.is_cancelled():
        mark_killed(tracking, job.request.run_id, error)
    else:
        mark_failed(tracking, job.request.run_id, error)
    return Outcome.failed(error)


def _follow(
    pool: str,
    client: SyncPrefectClient,
    waiting: list[Job],
    tracking: TrackingConfig,
    on_done: Callable[[Job, Outcome], None],
) -> None:
    """Poll until every job ended, submitting lost ones again."""
    logger = get_run_logger()
    idle_since = time.monotonic()
    while waiting:
        time.sleep(POLL_SECONDS)
        online = _online_workers(client, pool)
        if online:
            idle_since = time.monotonic()
        elif time.monotonic() - idle_since > IDLE_WARNING_SECONDS:
            logger.warning("no worker serves pool %r: `towerbench worker --pool %s`", pool, pool)
            idle_since = time.monotonic()
        ids = [job.submitted_run_id for job in waiting]
        flow_runs = {
            flow_run.id: flow_run
            for flow_run in client.read_flow_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=ids))
            )
        }
        for job in list(waiting):
            flow_run = flow_runs[job.submitted_run_id]
            outcome = _ended(job, flow_run, tracking)
            lost = None if outcome is not None else _lost(job, flow_run, online)
            if lost is not None:
                client.set_flow_run_state(flow_run.id, Crashed(message=lost), force=True)
                outcome = _outcome(tracking, job.request.run_id)  # it may have just finished
                if not outcome.status.ended:
                    if job.attempt < MAX_ATTEMPTS:
                        logger.warning(
                            "%s attempt %d %s: submitted again", job.name, job.attempt, lost
                        )
                        _submit(pool, job, tracking)
                        continue
                    error = f"lost {job.attempt} times on pool {pool!r}; the last: {lost}"
                    mark_failed(tracking, job.request.run_id, error)
                    outcome = Outcome.failed(error)
            if outcome is not None:
                waiting.remove(job)
                on_done(job, outcome)


def run_on_pool(
    pool: str,
    jobs: list[Job],
    tracking: TrackingConfig,
    on_done: Callable[[Job, Outcome], None],
) -> None:
    """Submit every job to `pool` and follow them to the end; `on_done(job, outcome)` as each
    ends. Stopped (Ctrl-C, SIGTERM), it cancels the flow runs it leaves and marks their runs
    KILLED."""
    waiting = list(jobs)
    with get_client(sync_client=True) as client:
        try:
            for job in jobs:
                _submit(pool, job, tracking)
            get_run_logger().info("%d configurations submitted to work pool %r", len(jobs), pool)
            _follow(pool, client, waiting, tracking, on_done)
        except BaseException:
            for job in waiting:  # the workers stop them; their runs keep their checkpoints
                with contextlib.suppress(Exception):  # a server may be what went away
                    if job.flow_run_id is not None:
                        client.set_flow_run_state(
                            job.flow_run_id, Cancelling(message=STOPPED), force=True
                        )
                with contextlib.suppress(Exception):
                    mark_killed(tracking, job.request.run_id, STOPPED)
            raise
