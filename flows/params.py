"""params.yaml -> the typed `Params`, refusing unknown keys and wrong types with file and key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from model.config import Params, apply_sweep_preset
from model.errors import TowerbenchError
from tasks.tracking import resolve_tracking


def _problems(error: ValidationError) -> str:
    parts = []
    for item in error.errors():
        key = ".".join(str(part) for part in item["loc"]) or "(top level)"
        given = item.get("input")
        shown = f" (got {given!r})" if given is not None and not isinstance(given, dict) else ""
        parts.append(f"{key}: {item['msg']}{shown}")
    return "; ".join(parts)


def read_sections(path: Path) -> dict[str, Any]:
    """The raw sections of a params file, with a clear error for a missing file or bad YAML."""
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        raise TowerbenchError(f"{path}: no such file") from None
    except yaml.YAMLError as error:
        raise TowerbenchError(f"{path}: not valid YAML: {str(error).splitlines()[0]}") from None
    if not isinstance(raw, dict):
        raise TowerbenchError(f"{path}: expected sections (fetch:, train:, ...), got {raw!r}")
    return raw


def load_params(path: Path) -> Params:
    """Read and validate a params file; paths in it are made absolute against its folder.

    A `sweep.preset` writes its experiment's settings over the file's `train:` and `sweep:`.
    Absolute paths matter because a served deployment runs its flows from another directory.
    """
    raw = apply_sweep_preset(read_sections(path))
    try:
        params = Params.model_validate(raw)
    except ValidationError as error:
        raise TowerbenchError(f"{path}: {_problems(error)}") from None
    return absolute_paths(params, path.resolve().parent)


def absolute_paths(params: Params, base_dir: Path) -> Params:
    """Data, report and tracking locations resolved against `base_dir`."""
    return params.model_copy(
        update={
            "data": params.data.model_copy(update={"data_dir": base_dir / params.data.data_dir}),
            "report": params.report.model_copy(
                update={"report_dir": base_dir / params.report.report_dir}
            ),
            "tracking": resolve_tracking(params.tracking, base_dir),
        }
    )
