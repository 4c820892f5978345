"""The `pipeline` flow: fetch -> preprocess through DVC -> sweep -> report."""

from __future__ import annotations

from typing import Any

from prefect import flow

from flows.sweep import FlowKind, sweep
from model.config import PipelineConfig
from tasks.preprocess import update_dataset_task

# `dvc repro` runs the fetch stage (the download) when it is stale: retrying can help there.
update_dataset_with_retries = update_dataset_task.with_options(
    retries=2, retry_delay_seconds=[10, 60]
)


def run_pipeline(config: PipelineConfig, kind: FlowKind) -> dict[str, Any]:
    """Bring the data up to date through DVC, then sweep with its hash as the data version."""
    data_version = update_dataset_with_retries(
        config.project_dir, config.fetch, config.preprocess
    )
    return sweep(
        sweep=config.sweep,
        tracking=config.tracking,
        report=config.report,
        data=config.data,
        data_version=data_version,
        kind=kind,
    )


@flow(name="pipeline")
def pipeline(config: PipelineConfig = PipelineConfig()) -> dict[str, Any]:  # noqa: B008
    """Fetch and preprocess the dataset (DVC), train every configuration, write the report."""
    return run_pipeline(config, "pipeline")
