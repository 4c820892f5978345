"""Prefect task: preprocess a dataset through DVC and return its data version."""

from __future__ import annotations

from pathlib import Path

from prefect import task

from model.config import PreprocessConfig
from tasks.dvc_stages import PREPROCESS_STAGE, data_version, repro_stage


@task(name="preprocess")
def preprocess_task(repo: Path, config: PreprocessConfig) -> str:
    """`dvc repro preprocess` in `repo`; the DVC content hash of the TFRecords."""
    repro_stage(repo, PREPROCESS_STAGE, {"preprocess": config})
    return data_version(repo)
