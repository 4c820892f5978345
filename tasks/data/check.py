"""The data version a sweep trains on, and making a pool worker's copy match it.

A sweep records one version per dataset: the DVC hash of its TFRecords folder (`<md5>.dir`, from
dvc.lock) when the pipeline built it through DVC, else the md5 of its manifest (which lists every
shard's sha256). A worker on another host trains only on that exact version: it pulls a DVC
version from the project's DVC remote, and refuses anything else with the reason.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
from pathlib import Path

from towerbench.core.errors import TowerbenchError
from towerbench.core.tfrecord_format import dataset_dir
from towerbench.tasks.data.dvc_stages import (
    FORM_DATASETS,
    PREPROCESS_STAGE,
    STAGES_FILE,
    DataStages,
    StageError,
    data_version,
    run_dvc,
)

MANIFEST_VERSION = "manifest-md5:"


def manifest_digest(data_dir: Path, dataset: str) -> str:
    """Data version when no DVC hash is given: md5 of the manifest, or "missing"."""
    manifest = dataset_dir(data_dir, dataset) / "manifest.json"
    if not manifest.is_file():
        return "missing"
    return MANIFEST_VERSION + hashlib.md5(manifest.read_bytes()).hexdigest()


def _stage_folders(project: Path) -> list[Path]:
    """params.yaml's stages, then those of the datasets it does not describe."""
    folders = [project, *sorted((project / FORM_DATASETS).glob("*"))]
    return [folder for folder in folders if (folder / "dvc.lock").is_file()]


def _stages_of(project: Path, version: str) -> DataStages:
    """The stage folder whose dvc.lock names `version`, or why this checkout has none."""
    held = []
    for folder in _stage_folders(project):
        try:
            held_version = data_version(folder)
        except TowerbenchError:
            continue
        if held_version == version:
            return DataStages(project, folder)
        held.append(held_version)
    raise TowerbenchError(
        f"{project}: this checkout's dvc.lock files name data {', '.join(held) or 'none'}, the "
        f"sweep trains on {version}: check out the sweep's commit here (git pull) and start the "
        "worker again"
    )


def _changed_outputs(stages: DataStages) -> list:
    """What `dvc status` finds changed in the stage's outputs (its inputs, the raw download, a
    worker does not need)."""
    result = run_dvc(stages.project, "status", stages.target(PREPROCESS_STAGE), "--json")
    status = json.loads(result.stdout or "{}")
    return [
        change
        for changes in status.values()
        for change in changes
        if isinstance(change, dict) and ("changed outs" in change or "changed checksum" in change)
    ]


def _pull(stages: DataStages) -> None:
    """`dvc pull` the stage's outputs unless the workspace already matches dvc.lock (one pull
    per checkout at a time: two concurrent ones can each report success too early). The lock
    file lives in the checkout's .dvc/tmp (DVC's own scratch folder, never committed), so it
    goes with the checkout."""
    lock_path = stages.project / ".dvc" / "tmp" / "towerbench-pull.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _changed_outputs(stages):
            return
        try:
            run_dvc(stages.project, "pull", "--force", stages.target(PREPROCESS_STAGE))
        except StageError as error:
            raise TowerbenchError(
                f"{error} (is the DVC remote reachable from this host, and was `dvc push` run "
                "after the data was built?)"
            ) from None
        left = _changed_outputs(stages)
        if left:
            raise TowerbenchError(
                f"{stages.folder / STAGES_FILE}: after `dvc pull` the data still differs from "
                f"dvc.lock: {json.dumps(left)}"
            )


def ensure_data(project: Path, data_dir: Path, dataset: str, version: str) -> None:
    """Make `dataset` under `data_dir` the sweep's `version` (pulling a DVC version), or fail."""
    if not version.startswith(MANIFEST_VERSION):
        _pull(_stages_of(project, version))
    held = manifest_digest(data_dir, dataset)
    if version.startswith(MANIFEST_VERSION) and held != version:
        raise TowerbenchError(
            f"{dataset_dir(data_dir, dataset)}: this worker has data {held}, the sweep trains "
            f"on {version}: build the same TFRecords here, or run the sweep through "
            "`towerbench pipeline`, whose DVC-versioned data every worker pulls"
        )
    if held == "missing":
        raise TowerbenchError(
            f"{dataset_dir(data_dir, dataset)}: no manifest.json after pulling data {version}"
        )
