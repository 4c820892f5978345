"""`towerbench pipeline` with a params file outside a DVC repository, or without the stages file
beside it (issue 29): one line naming the folder, exit 2, before Prefect or TensorFlow start."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from towerbench.cli.main import main

ROOT = Path(__file__).resolve().parents[1]


def _pipeline(params_file: Path, capsys) -> tuple[int, list[str], float]:
    started = time.monotonic()
    status = main(["pipeline", "--params", str(params_file)])
    return status, capsys.readouterr().err.strip().splitlines(), time.monotonic() - started


def test_a_folder_outside_a_dvc_repository_is_refused_at_once(tmp_path, capsys) -> None:
    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    status, errors, seconds = _pipeline(tmp_path / "params.yaml", capsys)
    assert status == 2 and len(errors) == 1, errors
    assert f"{tmp_path} is not inside a DVC repository" in errors[0]
    assert seconds < 5


def test_a_dvc_repository_without_the_stages_file_is_refused_at_once(tmp_path, capsys) -> None:
    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    (tmp_path / ".dvc").mkdir()
    status, errors, _ = _pipeline(tmp_path / "params.yaml", capsys)
    assert status == 2 and errors == [
        f"towerbench pipeline: error: {tmp_path / 'dvc.yaml'} is missing: copy towerbench's "
        "dvc.yaml beside params.yaml"
    ]
