"""The `benchmark` flow: a fixed small sweep, meant for a schedule, compared with its last run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow

from flows.pipeline import run_pipeline
from model.config import Params, PipelineConfig


@flow(name="benchmark")
def benchmark(
    config: PipelineConfig = Params().benchmark_pipeline(Path(".")),  # noqa: B008
) -> dict[str, Any]:
    """The pipeline with the benchmark's fixed sweep; its report compares with the previous
    finished benchmark in the same experiment (same configurations, data version shown)."""
    return run_pipeline(config, "benchmark")
