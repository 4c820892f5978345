"""The `sweep` flow: one training process per configuration, tracked in MLflow, then the report.

Running the same sweep again (same configurations, same data) resumes the newest unfinished one:
finished configurations are reused, an interrupted one continues from its checkpoint
(DATA_DIR/checkpoints/<run id>, saved every epoch) in the same MLflow run. `fresh=True` starts anew.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from pathlib import Path
from typing import Any, Literal
from uuid import UUID

from mlflow.entities import Run, RunStatus
from mlflow.exceptions import MlflowException
from prefect import flow, get_run_logger
from prefect.artifacts import (
    create_markdown_artifact,
    create_progress_artifact,
    update_progress_artifact,
)
from prefect.exceptions import TerminationSignal

from towerbench.config.grid import expand, group_name, run_name, swept_fields
from towerbench.config.params import Params, ReportConfig, SweepGrid, TrackingConfig
from towerbench.config.sections import DataConfig, TrainConfig
from towerbench.config.tracking_uri import PROJECT_DIR, resolve_tracking
from towerbench.core.errors import TowerbenchError
from towerbench.tasks.data_check import manifest_digest
from towerbench.tasks.fork_server import start_fork_server_for
from towerbench.tasks.report import make_report
from towerbench.tasks.tracking import (
    DONE_STATUSES,
    STATUS_TAG,
    config_key,
    create_config_run,
    ensure_experiment,
    experiment_name,
    finish_sweep_run,
    reopen_run,
    run_outcome,
    run_url,
    start_sweep_run,
    sweep_children,
    sweep_key,
    unfinished_sweep,
)
from towerbench.tasks.train import checkpoint_dir, train_configuration
from towerbench.tasks.train_worker import WorkerRequest

FlowKind = Literal["sweep", "pipeline", "benchmark"]


def _summary(run_id: str, name: str, config: TrainConfig, outcome: dict[str, Any]) -> dict:
    summary = {
        "run_id": run_id,
        "name": name,
        "towers": config.towers,
        "workers": config.workers,
        "seed": config.seed,
        "status": outcome["status"],
        "test_accuracy": outcome.get("test_accuracy"),
    }
    for optional in ("error", "unstable", "worker"):
        if outcome.get(optional):
            summary[optional] = outcome[optional]
    return summary


def _failure_summary(summaries: list[dict[str, Any]]) -> str:
    failed = [summary for summary in summaries if summary["status"] == "failed"]
    lines = [f"**{len(failed)} of {len(summaries)} configurations failed.**", ""]
    lines += [f"- `{summary['name']}`: {summary.get('error', 'see its log')}" for summary in failed]
    return "\n".join(lines)


def _train_here(
    request: WorkerRequest,
    name: str,
    tracking: TrackingConfig,
    progress: UUID,
    span: tuple[float, float],
) -> dict[str, Any]:
    """One configuration in a process of this machine; its summary."""
    state = train_configuration(request, name, tracking, progress, span, return_state=True)
    if state.is_failed():
        outcome = {"status": "failed", "error": str(state.result(raise_on_failure=False))}
    else:
        outcome = state.result()
        shutil.rmtree(request.checkpoint_dir, ignore_errors=True)  # the model is in MLflow
    return _summary(request.run_id, name, request.config, outcome)


def _on_workers(data_dir: Path) -> Path:
    """The data folder as workers find it: relative to the project (the folder the sweep runs
    in, else towerbench's checkout) when it lies inside it, so each worker takes it in its own
    `--project`; else as is (a shared mount)."""
    for project in (Path.cwd(), PROJECT_DIR):
        if data_dir.is_relative_to(project):
            return data_dir.relative_to(project)
    return data_dir


def _train_on_pool(
    pool: str,
    jobs: list[tuple[int, str, WorkerRequest]],
    data_dir: Path,
    tracking: TrackingConfig,
    progress: UUID,
) -> dict[int, dict[str, Any]]:
    """The configurations as flow runs of `pool`'s workers; index -> summary."""
    from towerbench.flows.fan_out import Job, run_on_pool

    if not (tracking.tracking_uri or "").startswith(("http://", "https://")):
        get_run_logger().warning(
            "tracking URI %s is not a server: only workers on this host can log to it",
            tracking.tracking_uri,
        )
    update = {"data_dir": _on_workers(data_dir), "checkpoint_dir": None}
    on_workers = [
        Job(index, request.model_copy(update=update), name) for index, name, request in jobs
    ]
    summaries: dict[int, dict[str, Any]] = {}

    def on_done(job: Job, outcome: dict[str, Any]) -> None:
        summaries[job.index] = _summary(job.request.run_id, job.name, job.request.config, outcome)
        update_progress_artifact(progress, 100 * len(summaries) / len(jobs))

    run_on_pool(pool, on_workers, tracking, on_done)
    return summaries


@flow(name="sweep", flow_run_name="sweep {train.dataset}")
def sweep(
    train: TrainConfig = TrainConfig(),  # noqa: B008 - immutable default shown in the UI form
    sweep: SweepGrid = SweepGrid(),  # noqa: B008
    tracking: TrackingConfig = TrackingConfig(),  # noqa: B008
    report: ReportConfig = ReportConfig(),  # noqa: B008
    data: DataConfig = DataConfig(),  # noqa: B008
    data_version: str | None = None,
    kind: FlowKind = "sweep",
    fresh: bool = False,
) -> dict[str, Any]:
    """Train `train` with every combination of the `sweep` lists (each run in its own process),
    then compare them.

    A configuration that fails or diverges is recorded as such and the sweep goes on; the sweep
    fails when every configuration failed, and otherwise completes with a "k of n failed"
    artifact. Returns the parent run id, one summary per configuration and the report's path.
    """
    logger = get_run_logger()
    tracking = resolve_tracking(tracking)
    data_dir = Path(data.data_dir).resolve()
    configs = expand(train, sweep)
    start_fork_server_for(configs, sweep.pool)  # imports beside the set-up (unless started)
    extra = swept_fields(sweep)
    versions = {
        dataset: (data_version if dataset == train.dataset and data_version else None)
        or manifest_digest(data_dir, dataset)
        for dataset in dict.fromkeys([train.dataset, *(c.dataset for c in configs)])
    }
    key = sweep_key(configs, list(versions.values()), kind)
    experiment_id = ensure_experiment(tracking, experiment_name(tracking, train))
    parent_run_id = None if fresh else unfinished_sweep(tracking, experiment_id, key)
    previous = {}
    if parent_run_id is not None:
        reopen_run(tracking, parent_run_id)
        previous = sweep_children(tracking, parent_run_id)
        done = sum(run.data.tags.get(STATUS_TAG) in DONE_STATUSES for run in previous.values())
        logger.info("resuming sweep %s: %d of %d runs done", parent_run_id, done, len(configs))
    else:
        parent_run_id = start_sweep_run(
            tracking,
            experiment_id,
            name=f"{kind} {train.dataset} {time.strftime('%Y-%m-%d %H:%M:%S')}",
            flow=kind,
            params={
                "train": train.model_dump(mode="json"),
                "sweep": sweep.model_dump(mode="json"),
                "data_version": versions[train.dataset],
            },
            swept=extra,
            key=key,
        )
    mlflow_url = run_url(tracking, experiment_id, parent_run_id)
    logger.info("%d runs; MLflow parent run %s", len(configs), mlflow_url)
    progress = create_progress_artifact(
        0.0, key="sweep-progress", description=f"Training {len(configs)} runs"
    )
    by_index: dict[int, dict[str, Any]] = {}  # configuration index -> summary
    status = RunStatus.FAILED
    try:
        pending = []
        for index, config in enumerate(configs):
            name = run_name(config, extra)
            earlier = previous.get(config_key(config))
            if earlier is not None and earlier.data.tags.get(STATUS_TAG) in DONE_STATUSES:
                by_index[index] = _summary(earlier.info.run_id, name, config, run_outcome(earlier))
                logger.info("%s: done in an earlier attempt, reused", name)
            else:
                pending.append((index, name, config, earlier))

        def open_run(name: str, config: TrainConfig, earlier: Run | None) -> WorkerRequest:
            """The configuration's MLflow run (its interrupted one, or a new child) and the
            request that trains it; opened just before it trains, so a stopped sweep leaves no
            run RUNNING that never started."""
            if earlier is not None:
                run_id = earlier.info.run_id
                reopen_run(tracking, run_id, "running")
            else:
                run_id = create_config_run(
                    tracking,
                    experiment_id,
                    parent_run_id,
                    config,
                    name,
                    group_name(config, extra),
                    versions[config.dataset],
                )
            return WorkerRequest(
                config=config,
                data_dir=data_dir,
                tracking_uri=tracking.tracking_uri or "",
                run_id=run_id,
                data_version=versions[config.dataset],
                checkpoint_dir=checkpoint_dir(data_dir, run_id),
            )

        if sweep.pool is None:
            for index, name, config, earlier in pending:
                span = (100 * index / len(configs), 100 * (index + 1) / len(configs))
                request = open_run(name, config, earlier)
                by_index[index] = _train_here(request, name, tracking, progress, span)
        else:
            from towerbench.flows.fan_out import check_served

            check_served(sweep.pool)  # before any run is opened
            jobs = [(i, name, open_run(name, c, earlier)) for i, name, c, earlier in pending]
            by_index.update(_train_on_pool(sweep.pool, jobs, data_dir, tracking, progress))
        summaries = [by_index[index] for index in sorted(by_index)]
        if all(summary["status"] == "failed" for summary in summaries):
            raise TowerbenchError(
                f"all {len(summaries)} configurations failed; the first: "
                f"{summaries[0].get('error', 'see its log')}"
            )
        if any(summary["status"] == "failed" for summary in summaries):
            create_markdown_artifact(
                _failure_summary(summaries),
                key="sweep-failures",
                description="Configurations that failed",
            )
        report_path = make_report(tracking, parent_run_id, report)
        status = RunStatus.FINISHED
    except (KeyboardInterrupt, SystemExit, TerminationSignal):  # Prefect's own SIGTERM signal
        status = RunStatus.KILLED
        raise
    except MlflowException as error:
        cause = str(error).splitlines()[0][:300]
        raise TowerbenchError(
            f"MLflow at {tracking.tracking_uri} stopped answering ({cause}); the runs keep their "
            "checkpoints: run the same command again once it is back to resume"
        ) from None
    finally:
        with contextlib.suppress(MlflowException):  # the server may be what went away
            finish_sweep_run(tracking, parent_run_id, RunStatus.to_string(status))
    logger.info("report: %s", report_path)
    return {
        "parent_run_id": parent_run_id,
        "mlflow_url": mlflow_url,
        "configs": summaries,
        "report": report_path,
    }


def sweep_params(params: Params, **options: Any) -> dict[str, Any]:
    """The sweep that `params` describes (its train, sweep, tracking, report and data sections);
    `options` are the flow's other parameters (data_version, kind, fresh)."""
    return sweep(
        train=params.train,
        sweep=params.sweep,
        tracking=params.tracking,
        report=params.report,
        data=params.data,
        **options,
    )
