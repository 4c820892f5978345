"""Prefect task: preprocess a dataset through DVC and return its data version."""

from __future__ import annotations

from prefect import task

from towerbench.tasks.data.dvc_stages import DataStages, update_dataset


@task(name="preprocess")
def preprocess_task(stages: DataStages) -> str:
    """`dvc repro preprocess` of `stages`; the DVC content hash of the TFRecords."""
    return update_dataset(stages)
