"""`towerbench worker`: a Prefect process worker that trains a pool's sweep configurations.

Prefect has no device placement of its own: each worker owns a set of devices (two workers on an
8-GPU host can own 4 each) and every flow run it starts inherits them through its environment
(CUDA_VISIBLE_DEVICES). The worker runs in this process, so one SIGTERM or Ctrl-C stops it, and
it marks the runs it leaves unfinished Crashed for the sweep to hand to another worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import signal
import socket
from pathlib import Path

from towerbench.core.errors import TowerbenchError
from towerbench.flows.config_run import DEVICES_ENV, PROJECT_ENV

WORKER_POLL_SECONDS = "2"  # Prefect's default, 10 s, makes every configuration wait that long


def worker_name(devices: str | None) -> str:
    """Unique per process: a restarted worker must not look like the one that left its runs."""
    return f"{socket.gethostname()}-{devices or 'all'}-{os.getpid()}"


def _ensure_pool(pool: str) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound
    from prefect.workers.process import ProcessWorker

    with get_client(sync_client=True) as client:
        try:
            found = client.read_work_pool(pool)
        except ObjectNotFound:
            template = ProcessWorker.get_default_base_job_template()
            try:
                client.create_work_pool(
                    WorkPoolCreate(name=pool, type="process", base_job_template=template)
                )
            except ObjectAlreadyExists:  # another worker created it meanwhile
                pass
            return
    if found.type != "process":
        raise TowerbenchError(
            f"work pool {pool!r} is of type {found.type!r}; towerbench workers need a "
            "`process` pool: pick another name"
        )


def _register_deployment(pool: str) -> None:
    """The per-configuration deployment, imported by module name on the worker (towerbench is
    installed in every worker's environment, so nothing is pulled)."""
    from prefect.deployments.runner import EntrypointType

    from towerbench.flows.config_run import deployment_name, train_config

    with contextlib.redirect_stdout(io.StringIO()):  # Prefect's table of deployments
        train_config.deploy(
            name=deployment_name(pool).split("/", 1)[1],
            work_pool_name=pool,
            entrypoint_type=EntrypointType.MODULE_PATH,
            build=False,
            push=False,
            print_next_steps=False,
            ignore_warnings=True,
        )


async def _crash_unfinished_runs(pool: str, name: str) -> list[str]:
    """Mark Crashed what this worker was running or starting (otherwise it stays Running)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
        WorkPoolFilter,
        WorkPoolFilterName,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.states import Crashed

    unfinished = [StateType.RUNNING, StateType.PENDING]
    async with get_client() as client:
        runs = await client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                state=FlowRunFilterState(type=FlowRunFilterStateType(any_=unfinished))
            ),
            work_pool_filter=WorkPoolFilter(name=WorkPoolFilterName(any_=[pool])),
        )
        mine = [run for run in runs if run.labels.get("prefect.worker.name") == name]
        for run in mine:
            await client.set_flow_run_state(
                run.id, Crashed(message=f"worker {name} stopped"), force=True
            )
    return [run.name for run in mine]


async def _serve(pool: str, name: str, limit: int) -> None:
    from prefect.workers.process import ProcessWorker

    worker = ProcessWorker(
        work_pool_name=pool, name=name, limit=limit, create_pool_if_not_found=False
    )
    main = asyncio.current_task()
    assert main is not None
    loop = asyncio.get_running_loop()
    for number in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(number, main.cancel)
    try:
        await worker.start()
    except asyncio.CancelledError:
        pass
    finally:
        for number in (signal.SIGTERM, signal.SIGINT):  # a second one must not cut this short
            loop.add_signal_handler(number, lambda: None)
        crashed = await _crash_unfinished_runs(pool, name)
        if crashed:
            print(f"worker {name}: left {', '.join(crashed)} to the other workers", flush=True)


def run_worker(pool: str, devices: str | None, limit: int, project: Path) -> None:
    """Serve `pool` from this machine until stopped, training on `devices` (GPU indices)."""
    # Inherited by every flow run this worker starts; set before Prefect reads its settings.
    os.environ[PROJECT_ENV] = str(project.resolve())
    os.environ[DEVICES_ENV] = devices or "all"
    if devices is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = devices
    os.environ.setdefault("PREFECT_WORKER_QUERY_SECONDS", WORKER_POLL_SECONDS)
    from towerbench.serve.deployments import prefect_api_url

    if prefect_api_url() is None:
        raise TowerbenchError(
            "PREFECT_API_URL is not set: a worker takes its runs from a Prefect server, e.g. "
            "PREFECT_API_URL=http://SERVER:4200/api (`prefect server start --host 0.0.0.0`)"
        )
    _ensure_pool(pool)
    _register_deployment(pool)
    name = worker_name(devices)
    print(f"worker {name}: serving pool {pool!r} (devices {devices or 'all'})", flush=True)
    asyncio.run(_serve(pool, name, limit))
