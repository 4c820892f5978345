"""Prefect task: fetch a dataset's raw files (network I/O, so it retries)."""

from __future__ import annotations

from pathlib import Path

from prefect import task

from model.config import DataConfig, FetchConfig
from model.sources import fetch


@task(name="fetch", retries=2, retry_delay_seconds=[5, 30])
def fetch_task(config: FetchConfig, data: DataConfig) -> Path:
    """DATA_DIR/raw/<name>/, verified and complete (see model.sources.fetch)."""
    return fetch(config, data.data_dir)
