"""Prefect task: fetch a dataset's raw files through DVC (network I/O, so it retries)."""

from __future__ import annotations

from pathlib import Path

from prefect import task

from model.config import FetchConfig
from tasks.dvc_stages import FETCH_STAGE, repro_stage


@task(name="fetch", retries=2, retry_delay_seconds=[10, 60])
def fetch_task(repo: Path, config: FetchConfig) -> None:
    """`dvc repro fetch` in `repo`: downloads only when the raw data is stale."""
    repro_stage(repo, FETCH_STAGE, {"fetch": config})
