"""Where a dataset's raw files live and how they are published atomically.

DATA_DIR/raw/<name>/ holds what `fetch` produced (an archive, a copied folder or arrays) plus
`source.json`, written last: a raw folder without it is unfinished and never preprocessed.
A fetch assembles the new version in the hidden sibling DATA_DIR/raw/.<name>.fetching/ and
swaps it in when complete; between fetches that folder only ever holds a partial download
(`*.part`) kept for the next fetch to resume.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from towerbench.core.errors import TowerbenchError
from towerbench.core.files import write_atomically

SOURCE_RECORD = "source.json"
PARTIAL_SUFFIX = ".part"


def raw_dir(data_dir: Path, name: str) -> Path:
    """DATA_DIR/raw/<name>: the fetched, verified input of preprocessing."""
    return Path(data_dir) / "raw" / name


def staging_dir(folder: Path) -> Path:
    """Where the next version of raw folder `folder` is assembled."""
    return folder.with_name(f".{folder.name}.fetching")


def link_previous(folder: Path, staging: Path) -> None:
    """Hard-link the files of the published `folder` into `staging`, so that a source finding
    its archive already there (same md5) does not fetch it again. Linking costs no space; a
    filesystem without hard links just means a fresh fetch."""
    if not folder.is_dir():
        return
    for path in folder.iterdir():
        target = staging / path.name
        if path.is_file() and path.name != SOURCE_RECORD and not target.exists():
            try:
                os.link(path, target)
            except OSError:
                return


def discard_staging(staging: Path) -> None:
    """After a failed fetch: keep only partial downloads (for resuming), and no empty folder."""
    if not staging.is_dir():
        return
    for path in staging.iterdir():
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        elif not path.name.endswith(PARTIAL_SUFFIX):
            path.unlink(missing_ok=True)
    with contextlib.suppress(OSError):  # kept while a partial download is in it
        staging.rmdir()


def ensure_writable(folder: Path) -> Path:
    """Create `folder` and prove we can write into it, or say which folder is the problem."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-test-"):
            pass
    except OSError as error:
        if error.errno == errno.ENAMETOOLONG:
            raise TowerbenchError(f"{folder}: path too long for the file system") from None
        raise TowerbenchError(
            f"{folder}: data dir is not writable ({error.strerror or error})"
        ) from None
    return folder


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
