"""The `pipeline` flow: fetch -> preprocess through DVC -> sweep -> report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow

from flows.sweep import FlowKind, sweep
from model.config import PipelineConfig
from model.errors import TowerbenchError
from model.sources import dataset_name
from tasks.fetch import fetch_task
from tasks.preprocess import preprocess_task
from tasks.report import publish_artifact


def check_trains_on_fetched_data(config: PipelineConfig) -> None:
    """The sweep must train on the dataset this pipeline builds, or its data version lies."""
    fetched = dataset_name(config.fetch)
    if config.sweep.base.dataset != fetched:
        raise TowerbenchError(
            f"train.dataset: {config.sweep.base.dataset!r} is not the dataset that fetch "
            f"builds ({fetched!r}); set train.dataset to {fetched!r} or change fetch"
        )


def run_pipeline(config: PipelineConfig, kind: FlowKind, fresh: bool = False) -> dict[str, Any]:
    """Bring the data up to date through DVC, then sweep with its hash as the data version."""
    check_trains_on_fetched_data(config)
    fetch_task(config.project_dir, config.fetch)
    data_version = preprocess_task(config.project_dir, config.preprocess)
    outcome = sweep(
        sweep=config.sweep,
        tracking=config.tracking,
        report=config.report,
        data=config.data,
        data_version=data_version,
        kind=kind,
        fresh=fresh,
    )
    # The top-level run shows the report too, with where to find it.
    lead = f"MLflow parent run: {outcome['mlflow_url']}\n\n"
    publish_artifact(Path(outcome["report"]), key=f"{kind}-report", lead=lead)
    return outcome


@flow(name="pipeline")
def pipeline(
    config: PipelineConfig = PipelineConfig(),  # noqa: B008
    fresh: bool = False,
) -> dict[str, Any]:
    """Fetch and preprocess the dataset (DVC), train every configuration, write the report.
    Runs again over an unfinished identical sweep resume it, unless `fresh`."""
    return run_pipeline(config, "pipeline", fresh)
