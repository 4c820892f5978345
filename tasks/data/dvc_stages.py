"""Bringing a dataset up to date through DVC, and its data version.

`dvc repro` rebuilds only the stages that are stale; the DVC content hash of
DATA_DIR/tfrecords/<name> in dvc.lock becomes the data version recorded with every MLflow run.
A dataset params.yaml does not describe (another one chosen in the Prefect form) is built by the
same stages in a folder of its own, so the user's params.yaml is never edited.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from towerbench.config.sections import DataConfig, FetchConfig, PreprocessConfig, dataset_name
from towerbench.core.errors import TowerbenchError
from towerbench.core.files import write_atomically
from towerbench.core.tfrecord_format import load_manifest, verify_shards

FETCH_STAGE = "fetch"
PREPROCESS_STAGE = "preprocess"
PARAMS_FILE = "params.yaml"
STAGES_FILE = "dvc.yaml"
FORM_DATASETS = "datasets"  # beside params.yaml: stage folders of the datasets it does not describe
# How ingest/download.py says it gave up on dropped connections or 5xx answers after its
# own retries; a later attempt resumes the partial file (tests/test_flows_fetch_retries.py).
_DOWNLOAD_GAVE_UP = re.compile(r"download failed after \d+ attempt")


class StageError(TowerbenchError):
    """`dvc repro` failed; `transient` when the cause was network I/O worth another attempt."""

    def __init__(self, message: str, transient: bool = False):
        super().__init__(message)
        self.transient = transient


def run_dvc(repo: Path, *arguments: str) -> subprocess.CompletedProcess[str]:
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
        dvc_error = next((line for line in lines if line.startswith("ERROR:")), None)
        said = cause or dvc_error or (lines[-1] if lines else "")
        raise StageError(
            f"{repo}: dvc {' '.join(arguments)} failed: {said}",
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


def _declared[Section: BaseModel](
    path: Path, document: dict[str, Any], section: str, model: type[Section]
) -> Section:
    """params.yaml's own values of `section` (`document` is the file read at `path`), validated
    by the model the form's values have."""
    try:
        return model.model_validate(document.get(section) or {})
    except ValidationError as error:
        problem = error.errors()[0]
        field = ".".join(str(part) for part in (section, *problem["loc"]))
        raise TowerbenchError(f"{path}: {field}: {problem['msg']}") from None


@dataclass(frozen=True)
class DataStages:
    """Where `dvc repro` builds a dataset: params.yaml's own stages (`folder` is the project), or
    the stage folder FORM_DATASETS/<name>/ of a dataset params.yaml does not describe."""

    project: Path
    folder: Path

    def target(self, stage: str) -> str:
        if self.folder == self.project:
            return stage
        return f"{self.folder.relative_to(self.project)}/dvc.yaml:{stage}"


def check_dvc_project(project: Path) -> None:
    """Refuse, in one line, a params file whose folder DVC cannot build data in: not inside a
    DVC repository, or without the stages file."""
    project = Path(project).resolve()
    if not any((folder / ".dvc").is_dir() for folder in (project, *project.parents)):
        raise TowerbenchError(
            f"{project / PARAMS_FILE}: {project} is not inside a DVC repository (no .dvc/ in it "
            "or above it): run `git init && dvc init` there first, or use `towerbench sweep` on "
            "data you preprocessed with `towerbench fetch` and `towerbench preprocess`"
        )
    if not (project / STAGES_FILE).is_file():
        raise TowerbenchError(
            f"{project / STAGES_FILE} is missing: copy towerbench's dvc.yaml beside params.yaml"
        )


def data_stages(
    project: Path, fetch: FetchConfig, preprocess: PreprocessConfig, data_dir: Path
) -> DataStages:
    """The stages that build `fetch` + `preprocess` into `data_dir`, without editing params.yaml.

    Settings equal to params.yaml's use its stages. Others get a stage folder of their own beside
    it, `datasets/<name>/` with the project's dvc.yaml and a params.yaml of these settings: DVC
    versions that data like any other (`dvc repro`, `dvc push` and `dvc status` see it).
    """
    project = Path(project).resolve()
    name = dataset_name(fetch)
    asked_fetch = fetch.model_copy(update={"name": name})
    path = project / PARAMS_FILE
    document = yaml.safe_load(path.read_text()) or {}  # params.yaml read once
    declared_fetch = _declared(path, document, "fetch", FetchConfig)
    declared_preprocess = _declared(path, document, "preprocess", PreprocessConfig)
    declared_data = _declared(path, document, "data", DataConfig)
    own_name = dataset_name(declared_fetch)
    compared = {
        "fetch": (asked_fetch, declared_fetch.model_copy(update={"name": own_name})),
        "preprocess": (preprocess, declared_preprocess),
    }
    differences = sorted(
        difference
        for section, (asked, declared) in compared.items()
        for difference in _differences(
            asked.model_dump(mode="json"), declared.model_dump(mode="json"), section
        )
    )
    same_data_dir = (project / declared_data.data_dir).resolve() == Path(data_dir).resolve()
    if not differences and same_data_dir:
        return DataStages(project, project)
    if name == own_name and differences:
        raise TowerbenchError(
            f"{path}: {'; '.join(differences)} (the form's dataset has "
            f"params.yaml's name {name!r} but other settings: give it another name, or leave "
            "the settings as they are)"
        )
    folder = project / FORM_DATASETS / name
    folder.mkdir(parents=True, exist_ok=True)
    params = {
        "fetch": asked_fetch.model_dump(mode="json", exclude_defaults=True),
        "preprocess": preprocess.model_dump(mode="json", exclude_defaults=True),
        "data": {"data_dir": os.path.relpath(Path(data_dir).resolve(), folder)},
    }
    write_atomically(folder / PARAMS_FILE, yaml.safe_dump(params, sort_keys=False).encode())
    write_atomically(folder / STAGES_FILE, (project / STAGES_FILE).read_bytes())
    return DataStages(project, folder)


def repro_stage(stages: DataStages, stage: str) -> None:
    """`dvc repro STAGE` (and the stages it depends on) where `stages` says."""
    run_dvc(stages.project, "repro", stages.target(stage))


def data_version(folder: Path) -> str:
    """The DVC md5 of the preprocessed TFRecords folder (`<hex>.dir`), from `folder`'s dvc.lock."""
    lock_path = Path(folder) / "dvc.lock"
    lock = yaml.safe_load(lock_path.read_text())
    try:
        return lock["stages"][PREPROCESS_STAGE]["outs"][0]["md5"]
    except (KeyError, IndexError, TypeError):
        raise TowerbenchError(
            f"{lock_path}: no output hash for stage {PREPROCESS_STAGE!r}"
        ) from None


def _damaged_output(stages: DataStages) -> str | None:
    """Why the TFRecords the preprocess stage made differ from their manifest (a shard missing,
    or with another sha256), or None."""
    lock = yaml.safe_load((stages.folder / "dvc.lock").read_text())
    folder = stages.folder / lock["stages"][PREPROCESS_STAGE]["outs"][0]["path"]
    try:
        verify_shards(folder, load_manifest(folder))
    except TowerbenchError as error:
        return str(error)
    return None


def update_dataset(stages: DataStages) -> str:
    """Fetch and preprocess through DVC; return the data version (see data_version).

    The TFRecords are then checked against their manifest's digests: DVC takes a file whose size
    and modification time are unchanged for unchanged, so a shard damaged in place behind its
    back is rebuilt here, once; damage that remains is a StageError naming the shard.
    """
    repro_stage(stages, PREPROCESS_STAGE)
    if _damaged_output(stages) is not None:
        run_dvc(
            stages.project, "repro", "--force", "--single-item", stages.target(PREPROCESS_STAGE)
        )
        problem = _damaged_output(stages)
        if problem is not None:
            raise StageError(problem)
    return data_version(stages.folder)
