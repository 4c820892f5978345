"""Bringing a dataset up to date through DVC, and its data version.

`dvc repro` rebuilds only the stages that are stale; the DVC content hash of
DATA_DIR/tfrecords/<name> in dvc.lock becomes the data version recorded with every MLflow run.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from model.config import FetchConfig, PreprocessConfig
from model.errors import TowerbenchError

FETCH_STAGE = "fetch"
PREPROCESS_STAGE = "preprocess"
PARAMS_FILE = "params.yaml"
# How model/sources/download.py says it gave up on dropped connections or 5xx answers after its
# own retries; a later attempt resumes the partial file (tests/test_flows_fetch_retries.py).
_DOWNLOAD_GAVE_UP = re.compile(r"download failed after \d+ attempt")


class StageError(TowerbenchError):
    """`dvc repro` failed; `transient` when the cause was network I/O worth another attempt."""

    def __init__(self, message: str, transient: bool = False):
        super().__init__(message)
        self.transient = transient


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
        raise StageError(
            f"{repo}: dvc {' '.join(arguments)} failed: {cause or (lines[-1] if lines else '')}",
            transient=cause is not None and _DOWNLOAD_GAVE_UP.search(cause) is not None,
        )
    return result


def _differences(asked: Any, declared: Any, key: str) -> list[str]:
    """`key: <asked> in the form, <declared> in params.yaml` for every leaf that differs."""
    if isinstance(asked, dict) and isinstance(declared, dict):
        return [
            difference
            for field in asked.keys() | declared.keys()
            for difference in _differences(asked.get(field), declared.get(field), f"{key}.{field}")
        ]
    if asked == declared:
        return []
    return [f"{key}: {asked!r} in the form, {declared!r} in params.yaml"]


def _check_matches_params(repo: Path, expected: dict[str, BaseModel]) -> None:
    """DVC stages read params.yaml; refuse silently building something other than asked."""
    path = repo / PARAMS_FILE
    document = yaml.safe_load(path.read_text()) or {}
    differences = []
    for section, config in expected.items():
        try:
            declared = type(config).model_validate(document.get(section) or {})
        except ValidationError as error:
            problem = error.errors()[0]
            field = ".".join(str(part) for part in (section, *problem["loc"]))
            raise TowerbenchError(f"{path}: {field}: {problem['msg']}") from None
        differences += sorted(
            _differences(config.model_dump(mode="json"), declared.model_dump(mode="json"), section)
        )
    if differences:
        raise TowerbenchError(
            f"{path}: {'; '.join(differences)} (DVC builds the data from params.yaml: "
            "change it there, or leave the form's value as it was)"
        )


def repro_stage(repo: Path, stage: str, expected: dict[str, BaseModel | None]) -> None:
    """`dvc repro STAGE` in `repo` (and the stages it depends on), after checking that the
    params.yaml sections in `expected` are the settings the caller asked for."""
    _check_matches_params(Path(repo), {key: value for key, value in expected.items() if value})
    _run_dvc(Path(repo), "repro", stage)


def data_version(repo: Path) -> str:
    """The DVC md5 of the preprocessed TFRecords folder (`<hex>.dir`), from dvc.lock."""
    lock_path = Path(repo) / "dvc.lock"
    lock = yaml.safe_load(lock_path.read_text())
    try:
        return lock["stages"][PREPROCESS_STAGE]["outs"][0]["md5"]
    except (KeyError, IndexError, TypeError):
        raise TowerbenchError(
            f"{lock_path}: no output hash for stage {PREPROCESS_STAGE!r}"
        ) from None


def update_dataset(
    repo: Path,
    fetch: FetchConfig | None = None,
    preprocess_config: PreprocessConfig | None = None,
) -> str:
    """Fetch and preprocess through DVC in `repo`; return the data version (see data_version).

    If `fetch`/`preprocess_config` are given they must equal params.yaml's sections.
    """
    repro_stage(repo, PREPROCESS_STAGE, {"fetch": fetch, "preprocess": preprocess_config})
    return data_version(repo)
