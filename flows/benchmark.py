"""The `benchmark` flow: a fixed small sweep, meant for a schedule, compared with its last run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow

from towerbench.config.load import load
from towerbench.flows.pipeline import run_pipeline
from towerbench.tasks.user_errors_log import one_line_user_errors


@flow(name="benchmark")
def benchmark(params_file: str = "params.yaml") -> dict[str, Any]:
    """The pipeline with the benchmark's fixed sweep; its report compares with the previous
    finished benchmark in the same experiment (same configurations, data version shown).

    Args:
        params_file: The params.yaml whose `benchmark:` patch on its `train:` and `sweep:`
            fixes the sweep.
    """
    one_line_user_errors()
    path = Path(params_file)
    return run_pipeline(load(path).benchmark_params(), path.resolve().parent, "benchmark")
