"""Prefect task: fetch a dataset's raw files through DVC; a download that gave up is retried."""

from __future__ import annotations

from pathlib import Path

from prefect import Task, task
from prefect.client.schemas.objects import State, TaskRun

from towerbench.config.sections import FetchConfig, PreprocessConfig
from towerbench.tasks.data.dvc_stages import (
    FETCH_STAGE,
    DataStages,
    StageError,
    data_stages,
    repro_stage,
)

RETRY_DELAYS_SECONDS: list[float] = [10, 60]


def transient_io_failure(task: Task, task_run: TaskRun, state: State) -> bool:  # noqa: ARG001
    """Prefect's `retry_condition_fn`: retry only when the download gave up on dropped
    connections or server errors (it resumes); a settings or validation error fails at once."""
    error = state.result(raise_on_failure=False)
    return isinstance(error, StageError) and error.transient


@task(
    name="fetch",
    retries=len(RETRY_DELAYS_SECONDS),
    retry_delay_seconds=RETRY_DELAYS_SECONDS,
    retry_condition_fn=transient_io_failure,
)
def fetch_task(
    project: Path, fetch: FetchConfig, preprocess: PreprocessConfig, data_dir: Path
) -> DataStages:
    """`dvc repro fetch` of the stages that build this dataset (params.yaml's, or its own
    folder's): downloads only when the raw data is stale."""
    stages = data_stages(project, fetch, preprocess, data_dir)
    repro_stage(stages, FETCH_STAGE)
    return stages
