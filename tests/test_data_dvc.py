"""Real DVC in a temporary git repository: repro, a clean status, push/pull to a local remote,
and the content hash `update_dataset` returns as the data version."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from towerbench.config.sections import FetchConfig, PreprocessConfig
from towerbench.core.errors import TowerbenchError
from towerbench.core.tfrecord_format import dataset_dir, load_manifest
from towerbench.tasks.data.check import ensure_data, manifest_digest
from towerbench.tasks.data.dvc_stages import DataStages, data_stages, run_dvc, update_dataset

pytestmark = pytest.mark.slow  # trains, or starts servers or processes

PROJECT = Path(__file__).resolve().parents[1]


@pytest.fixture()
def repo(tmp_path):
    """A fresh git + DVC project holding the real dvc.yaml, params.yaml and data/.gitignore."""
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    for name in ("dvc.yaml", "params.yaml", "data/.gitignore"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        shutil.copy(PROJECT / name, tmp_path / name)
    run_dvc(tmp_path, "init", "-q")
    run_dvc(tmp_path, "remote", "add", "-d", "local", str(tmp_path / "remote"))
    return tmp_path


def test_repro_status_push_pull_and_content_hash(repo):
    version = update_dataset(DataStages(repo, repo))
    assert version.endswith(".dir")
    manifest = load_manifest(dataset_dir(repo / "data", "digits"))
    assert "up to date" in run_dvc(repo, "status").stdout
    # A second call rebuilds nothing and reports the same version.
    assert update_dataset(DataStages(repo, repo)) == version

    # A pool worker without the data (a fresh checkout: no raw download either) pulls the
    # TFRecords from the remote, and says so when it cannot.
    run_dvc(repo, "push")
    for folder in ("data/tfrecords", "data/raw", ".dvc/cache"):
        shutil.rmtree(repo / folder)
    run_dvc(repo, "remote", "modify", "local", "url", str(repo / "empty-remote"))
    with pytest.raises(
        TowerbenchError, match=r"ERROR: failed to pull data.*remote reachable.*dvc push"
    ):
        ensure_data(repo, repo / "data", "digits", version)
    run_dvc(repo, "remote", "modify", "local", "url", str(repo / "remote"))
    ensure_data(repo, repo / "data", "digits", version)
    assert load_manifest(dataset_dir(repo / "data", "digits")) == manifest
    assert not (repo / "data" / "raw").exists()  # what the worker does not need stays out
    with pytest.raises(TowerbenchError, match=rf"name data {version}, the sweep trains on 0+\.dir"):
        ensure_data(repo, repo / "data", "digits", "0" * 32 + ".dir")
    held = manifest_digest(repo / "data", "digits")
    ensure_data(repo, repo / "data", "digits", held)
    with pytest.raises(TowerbenchError, match=rf"this worker has data {held}, the sweep trains"):
        ensure_data(repo, repo / "data", "digits", "manifest-md5:0")

    # A declared parameter makes the stage stale and changes the data version.
    params = repo / "params.yaml"
    params.write_text(params.read_text().replace("shards: 4", "shards: 2"))
    assert "preprocess" in run_dvc(repo, "status").stdout
    own = update_dataset(DataStages(repo, repo))
    assert own != version

    # Other settings (a Prefect form's) get a DVC stage folder of their own; params.yaml is not
    # edited, and DVC tracks both datasets.
    text = params.read_text()
    other = PreprocessConfig(shards=3)
    stages = data_stages(repo, FetchConfig(name="digits-3"), other, repo / "data")
    assert stages.folder == repo / "datasets" / "digits-3"
    other_version = update_dataset(stages)
    lock = yaml.safe_load((stages.folder / "dvc.lock").read_text())
    assert other_version == lock["stages"]["preprocess"]["outs"][0]["md5"] != own
    assert len(load_manifest(dataset_dir(repo / "data", "digits-3")).splits["train"].files) == 3
    assert params.read_text() == text
    assert "up to date" in run_dvc(repo, "status").stdout
    # The same name with other settings would overwrite params.yaml's data: refused by field.
    with pytest.raises(TowerbenchError, match=r"preprocess.shards: 3 in the form, 2 in params"):
        data_stages(repo, FetchConfig(name="digits"), other, repo / "data")


def test_a_shard_damaged_behind_dvcs_back_is_rebuilt_at_preprocess(repo):
    """DVC takes a file of unchanged size and modification time for unchanged: the digests in
    the manifest find the damage, and preprocessing rebuilds it to the same version."""
    version = update_dataset(DataStages(repo, repo))
    shard = sorted((repo / "data" / "tfrecords" / "digits").glob("train-*.tfrecord"))[1]
    good, seen = shard.read_bytes(), shard.stat()
    damaged = bytearray(good)
    damaged[len(damaged) // 2] ^= 0xFF
    shard.write_bytes(bytes(damaged))
    os.utime(shard, ns=(seen.st_atime_ns, seen.st_mtime_ns))
    assert "up to date" in run_dvc(repo, "status").stdout  # DVC does not see it

    assert update_dataset(DataStages(repo, repo)) == version
    assert shard.read_bytes() == good
