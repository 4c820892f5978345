"""Preprocessing as Prefect tasks, and bringing a dataset up to date through DVC.

`update_dataset` is how the pipeline gets its data: `dvc repro preprocess` rebuilds only what is
stale (fetch first if needed) and the DVC content hash of DATA_DIR/tfrecords/<name> in dvc.lock
becomes the data version recorded with every MLflow run.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml
from prefect import task

from model.config import DataConfig, FetchConfig, PreprocessConfig
from model.errors import TowerbenchError
from model.sources import preprocess
from model.tfrecords import Manifest

PREPROCESS_STAGE = "preprocess"
PARAMS_FILE = "params.yaml"


def _run_dvc(repo: Path, *arguments: str) -> subprocess.CompletedProcess[str]:
    """Run the DVC of this environment in `repo`; its stage commands find our `towerbench`."""
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": bin_dir + os.pathsep + os.environ.get("PATH", "")}
    result = subprocess.run(
        [sys.executable, "-m", "dvc", *arguments],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        lines = [line for line in (result.stderr + result.stdout).splitlines() if line.strip()]
        # The stage's own one-line error (from the towerbench CLI) says most; show it.
        cause = next((line for line in lines if "towerbench" in line and "error:" in line), None)
        raise TowerbenchError(
            f"{repo}: dvc {' '.join(arguments)} failed: {cause or (lines[-1] if lines else '')}"
        )
    return result


def _check_matches_params(repo: Path, expected: dict[str, object]) -> None:
    """DVC stages read params.yaml; refuse silently building something other than asked."""
    path = repo / PARAMS_FILE
    document = yaml.safe_load(path.read_text()) or {}
    for section, config in expected.items():
        declared = type(config).model_validate(document.get(section) or {})
        if declared != config:
            raise TowerbenchError(
                f"{path}: section {section!r} differs from the requested settings; DVC builds "
                f"the data from params.yaml, so edit it there ({declared} != {config})"
            )


def update_dataset(
    repo: Path,
    fetch: FetchConfig | None = None,
    preprocess_config: PreprocessConfig | None = None,
) -> str:
    """`dvc repro preprocess` in `repo`; return the DVC md5 of the TFRecords folder (`<hex>.dir`).

    If `fetch`/`preprocess_config` are given they must equal params.yaml's sections.
    """
    repo = Path(repo)
    expected = {"fetch": fetch, "preprocess": preprocess_config}
    _check_matches_params(repo, {key: value for key, value in expected.items() if value})
    _run_dvc(repo, "repro", PREPROCESS_STAGE)
    lock_path = repo / "dvc.lock"
    lock = yaml.safe_load(lock_path.read_text())
    try:
        return lock["stages"][PREPROCESS_STAGE]["outs"][0]["md5"]
    except (KeyError, IndexError, TypeError):
        raise TowerbenchError(
            f"{lock_path}: no output hash for stage {PREPROCESS_STAGE!r}"
        ) from None


@task(name="preprocess")
def preprocess_task(name: str, config: PreprocessConfig, data: DataConfig) -> Manifest:
    """DATA_DIR/raw/<name> -> DATA_DIR/tfrecords/<name> without DVC (see model.sources)."""
    return preprocess(name, config, data.data_dir)


@task(name="update-dataset")
def update_dataset_task(
    repo: Path, fetch: FetchConfig | None = None, preprocess_config: PreprocessConfig | None = None
) -> str:
    """The data version: the DVC content hash of the dataset's TFRecords after `dvc repro`."""
    return update_dataset(repo, fetch, preprocess_config)
