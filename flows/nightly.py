"""The `nightly` flow: a fixed small accuracy sweep, meant for a schedule, compared with its last
run (the speed benchmarks are `towerbench bench`, in speed/ and overhead/)."""

from __future__ import annotations

from functools import partial
from pathlib import Path

from prefect import flow

from towerbench.config.load import load
from towerbench.core.outcome import SweepResult
from towerbench.flows.pipeline import run_pipeline
from towerbench.flows.run_names import dated_run_name
from towerbench.tasks.user_errors_log import one_line_user_errors


@flow(name="nightly", flow_run_name=partial(dated_run_name, "nightly"))
def nightly(params_file: str = "params.yaml") -> SweepResult:
    """The pipeline with the nightly's fixed sweep; its report compares with the previous
    finished nightly sweep in the same experiment (same configurations, data version shown).

    Args:
        params_file: The params.yaml whose `nightly:` patch on its `train:` and `sweep:`
            fixes the sweep.
    """
    one_line_user_errors()
    path = Path(params_file)
    return run_pipeline(load(path).nightly_params(), path.resolve().parent, "nightly")
