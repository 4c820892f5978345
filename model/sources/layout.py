"""Where a dataset's raw files live and how they are published atomically.

DATA_DIR/raw/<name>/ holds what `fetch` produced (an archive, a copied folder or arrays) plus
`source.json`, written last: a raw folder without it is unfinished and never preprocessed.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from model.errors import TowerbenchError

SOURCE_RECORD = "source.json"


def raw_dir(data_dir: Path, name: str) -> Path:
    """DATA_DIR/raw/<name>: the fetched, verified input of preprocessing."""
    return Path(data_dir) / "raw" / name


def ensure_writable(folder: Path) -> Path:
    """Create `folder` and prove we can write into it, or say which folder is the problem."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-test-"):
            pass
    except OSError as error:
        raise TowerbenchError(
            f"{folder}: data dir is not writable ({error.strerror or error})"
        ) from None
    return folder


def write_atomically(path: Path, data: bytes) -> None:
    """Write `data` to a temporary sibling of `path`, then rename it into place."""
    handle, temp_name = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as temp_file:
            temp_file.write(data)
        os.chmod(temp_name, 0o644)
        os.replace(temp_name, path)
    except BaseException:
        Path(temp_name).unlink(missing_ok=True)
        raise


def write_source_record(folder: Path, record: dict[str, Any]) -> None:
    """Mark `folder` as complete, describing where its contents came from."""
    text = json.dumps(record, indent=2, sort_keys=True) + "\n"
    write_atomically(folder / SOURCE_RECORD, text.encode())


def read_source_record(folder: Path) -> dict[str, Any]:
    """The record `fetch` left in `folder`; a TowerbenchError if the fetch never completed."""
    path = folder / SOURCE_RECORD
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise TowerbenchError(
            f"{folder}: no fetched dataset here; run `towerbench fetch` for it first"
        ) from None
    except (OSError, ValueError) as error:
        raise TowerbenchError(f"{path}: unreadable source record ({error})") from None
