"""Real DVC in a temporary git repository: repro, a clean status, push/pull to a local remote,
and the content hash `update_dataset` returns as the data version."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from model.errors import TowerbenchError
from model.tfrecords import dataset_dir, load_manifest
from tasks.dvc_stages import _run_dvc, update_dataset

pytestmark = pytest.mark.slow  # trains, or starts servers or processes

PROJECT = Path(__file__).resolve().parents[1]


@pytest.fixture()
def repo(tmp_path):
    """A fresh git + DVC project holding the real dvc.yaml, params.yaml and data/.gitignore."""
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    for name in ("dvc.yaml", "params.yaml", "data/.gitignore"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        shutil.copy(PROJECT / name, tmp_path / name)
    _run_dvc(tmp_path, "init", "-q")
    _run_dvc(tmp_path, "remote", "add", "-d", "local", str(tmp_path / "remote"))
    return tmp_path


def test_repro_status_push_pull_and_content_hash(repo):
    version = update_dataset(repo)
    assert version.endswith(".dir")
    manifest = load_manifest(dataset_dir(repo / "data", "digits"))
    assert "up to date" in _run_dvc(repo, "status").stdout
    # A second call rebuilds nothing and reports the same version.
    assert update_dataset(repo) == version

    _run_dvc(repo, "push")
    shutil.rmtree(repo / "data" / "tfrecords")
    shutil.rmtree(repo / ".dvc" / "cache")
    _run_dvc(repo, "pull")
    assert load_manifest(dataset_dir(repo / "data", "digits")) == manifest
    assert "up to date" in _run_dvc(repo, "status").stdout

    # A declared parameter makes the stage stale and changes the data version.
    params = repo / "params.yaml"
    params.write_text(params.read_text().replace("shards: 4", "shards: 2"))
    assert "preprocess" in _run_dvc(repo, "status").stdout
    assert update_dataset(repo) != version


def test_settings_other_than_params_yaml_are_refused(repo):
    from model.config import FetchConfig

    with pytest.raises(TowerbenchError, match="params.yaml"):
        update_dataset(repo, FetchConfig(source="cifar10", name="cifar10"))
