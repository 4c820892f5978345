"""Writing files safely: a file or folder appears whole (written aside, then renamed), and a
full disk is one line.

A full disk (ENOSPC, or a user's quota: EDQUOT) can strike any write. Wherever it does, the user
gets one line naming the path and, when known, how much space the step needs, and the step's
temporary files are gone (each caller cleans up its own staging).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from towerbench.core.errors import TowerbenchError

NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def is_no_space(error: BaseException) -> bool:
    """Whether `error` is the operating system saying the disk (or quota) is full."""
    return isinstance(error, OSError) and error.errno in NO_SPACE_ERRNOS


def format_bytes(count: int) -> str:
    """1536 -> '1.5 KiB'."""
    if count < 1024:
        return f"{count} bytes"
    size, unit = count / 1024, "KiB"
    for bigger in ("MiB", "GiB", "TiB"):
        if size < 1024:
            break
        size, unit = size / 1024, bigger
    return f"{size:.1f} {unit}"


def no_space_error(path: Path, needed: int | None = None, what: str = "") -> TowerbenchError:
    """The one-line error for a full disk while writing `path` (`what` says for what)."""
    purpose = f" for {what}" if what else ""
    need = f"; needs {format_bytes(needed)}" if needed is not None else ""
    return TowerbenchError(f"{path}: no space left on device{purpose}{need}")


@contextlib.contextmanager
def space_errors(path: Path, needed: int | None = None, what: str = "") -> Iterator[None]:
    """Turn a full disk inside the block into `no_space_error(path, needed, what)`."""
    try:
        yield
    except OSError as error:
        if is_no_space(error):
            raise no_space_error(path, needed, what) from None
        raise


def replace_folder(new: Path, target: Path) -> None:
    """Move `new` to `target`, swapping out any previous version with two renames."""
    if target.exists():
        old = target.with_name(f".{target.name}.old-{os.getpid()}")
        os.replace(target, old)
        os.replace(new, target)
        shutil.rmtree(old)
    else:
        os.replace(new, target)


def write_atomically(path: Path, data: bytes) -> None:
    """Write `data` to a temporary sibling of `path`, then rename it into place."""
    with space_errors(path, len(data)):
        handle, temp_name = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        try:
            with os.fdopen(handle, "wb") as temp_file:
                temp_file.write(data)
            os.chmod(temp_name, 0o644)
            os.replace(temp_name, path)
        except BaseException:
            Path(temp_name).unlink(missing_ok=True)
            raise


@contextlib.contextmanager
def no_new_empty_folders(path: Path) -> Iterator[None]:
    """On an exception inside, remove the folders on the way to `path` that did not exist
    before and are empty: a failed fetch or preprocess leaves the data folder as it was."""
    missing = [folder for folder in (path, *path.parents) if not os.path.lexists(folder)]
    try:
        yield
    except BaseException:
        for folder in missing:  # the deepest first
            try:
                folder.rmdir()
            except FileNotFoundError:
                continue  # removed already
            except OSError:
                break  # not empty: it and its parents stay
        raise
