"""Prefect task: preprocess a dataset through DVC and return its data version."""

from __future__ import annotations

from pathlib import Path

from prefect import task

from model.config import PreprocessConfig
from tasks.dvc_stages import update_dataset


@task(name="preprocess")
def preprocess_task(repo: Path, config: PreprocessConfig) -> str:
    """`dvc repro preprocess` in `repo`; the DVC content hash of the TFRecords."""
    return update_dataset(repo, preprocess_config=config)
