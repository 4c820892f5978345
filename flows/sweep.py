"""The `sweep` flow: one training process per configuration, tracked in MLflow, then the report."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Any, Literal

from prefect import flow, get_run_logger
from prefect.artifacts import create_progress_artifact

from model.config import DataConfig, ReportConfig, SweepConfig, TrackingConfig
from model.sweep import expand, group_name, run_name, swept_fields
from model.tfrecords import dataset_dir
from tasks.report import make_report
from tasks.tracking import (
    create_config_run,
    ensure_experiment,
    experiment_name,
    finish_sweep_run,
    resolve_tracking,
    run_url,
    start_sweep_run,
)
from tasks.train import train_configuration
from tasks.train_worker import WorkerRequest

FlowKind = Literal["sweep", "pipeline", "benchmark"]


def manifest_digest(data_dir: Path, dataset: str) -> str:
    """Data version when no DVC hash is given: md5 of the manifest, which lists every shard's
    sha256 (so it changes whenever the TFRecords do)."""
    manifest = dataset_dir(data_dir, dataset) / "manifest.json"
    if not manifest.is_file():
        return "missing"
    return "manifest-md5:" + hashlib.md5(manifest.read_bytes()).hexdigest()


@flow(name="sweep", flow_run_name="sweep {sweep.base.dataset}")
def sweep(
    sweep: SweepConfig = SweepConfig(),  # noqa: B008 - immutable default shown in the UI form
    tracking: TrackingConfig = TrackingConfig(),  # noqa: B008
    report: ReportConfig = ReportConfig(),  # noqa: B008
    data: DataConfig = DataConfig(),  # noqa: B008
    data_version: str | None = None,
    kind: FlowKind = "sweep",
) -> dict[str, Any]:
    """Train every configuration of the sweep (each in its own process), then compare them.

    A configuration that fails or diverges is recorded as such and the sweep goes on. Returns
    the parent run id, one summary per configuration and the report's path.
    """
    logger = get_run_logger()
    tracking = resolve_tracking(tracking)
    data_dir = Path(data.data_dir).resolve()
    configs = expand(sweep)
    extra = swept_fields(sweep)
    versions = {sweep.base.dataset: data_version or manifest_digest(data_dir, sweep.base.dataset)}
    experiment_id = ensure_experiment(tracking, experiment_name(tracking, sweep.base))
    parent_run_id = start_sweep_run(
        tracking,
        experiment_id,
        name=f"{kind} {sweep.base.dataset} {time.strftime('%Y-%m-%d %H:%M:%S')}",
        flow=kind,
        params={
            "sweep": sweep.model_dump(mode="json"),
            "data_version": versions[sweep.base.dataset],
        },
        swept=extra,
    )
    logger.info(
        "%d runs; MLflow parent run %s",
        len(configs),
        run_url(tracking, experiment_id, parent_run_id),
    )
    progress = create_progress_artifact(
        0.0, key="sweep-progress", description=f"Training {len(configs)} runs"
    )
    summaries = []
    failed = True
    try:
        for index, config in enumerate(configs):
            name = run_name(config, extra)
            if config.dataset not in versions:  # the sweep varies the dataset itself
                versions[config.dataset] = manifest_digest(data_dir, config.dataset)
            run_id = create_config_run(
                tracking,
                experiment_id,
                parent_run_id,
                config,
                name,
                group_name(config, extra),
                versions[config.dataset],
            )
            request = WorkerRequest(
                config=config,
                data_dir=data_dir,
                tracking_uri=tracking.tracking_uri or "",
                run_id=run_id,
                data_version=versions[config.dataset],
            )
            span = (100 * index / len(configs), 100 * (index + 1) / len(configs))
            outcome = train_configuration(request, name, tracking, progress, span)
            summaries.append(
                {
                    "run_id": run_id,
                    "name": name,
                    "towers": config.towers,
                    "seed": config.seed,
                    "status": outcome["status"],
                    "test_accuracy": outcome.get("test_accuracy"),
                }
                | ({"error": outcome["error"]} if outcome.get("error") else {})
            )
        report_path = make_report(tracking, parent_run_id, report)
        failed = False
    finally:
        finish_sweep_run(tracking, parent_run_id, failed)
    logger.info("report: %s", report_path)
    return {"parent_run_id": parent_run_id, "configs": summaries, "report": report_path}
