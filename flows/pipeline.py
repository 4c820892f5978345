"""The `pipeline` flow: fetch -> preprocess through DVC -> sweep -> report."""

from __future__ import annotations

from typing import Any

from prefect import flow

from flows.sweep import FlowKind, sweep
from model.config import PipelineConfig
from tasks.fetch import fetch_task
from tasks.preprocess import preprocess_task


def run_pipeline(config: PipelineConfig, kind: FlowKind) -> dict[str, Any]:
    """Bring the data up to date through DVC, then sweep with its hash as the data version."""
    fetch_task(config.project_dir, config.fetch)
    data_version = preprocess_task(config.project_dir, config.preprocess)
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
