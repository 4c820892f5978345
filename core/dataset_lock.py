"""A dataset is never replaced under its reader, nor fetched twice at once.

The lock is an `flock` on the dataset's folder itself (no file is added; the kernel releases it
when its process ends, however it ends). A training (a sweep, an advise's verification, `train`)
holds DATA_DIR/tfrecords/<name>/ shared while it reads it; `preprocess` holds it exclusively
until its new version is swapped in; `fetch` holds its staging folder DATA_DIR/raw/.<name>.fetching/
exclusively while it assembles the raw data there. Whoever finds a folder held the other way
refuses at once, in one line (exit status 2), and can simply be run again.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from towerbench.core.errors import TowerbenchError
from towerbench.core.tfrecord_format import dataset_dir

_AGAIN = "wait for that to end, then run this again"


@contextlib.contextmanager
def _folder_held(folder: Path, writing: bool, refusal: str) -> Iterator[None]:
    """`folder` locked while the block runs (a folder not there yet has nothing to protect)."""
    try:
        descriptor = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except FileNotFoundError:
        yield
        return
    try:
        try:
            fcntl.flock(descriptor, (fcntl.LOCK_EX if writing else fcntl.LOCK_SH) | fcntl.LOCK_NB)
        except BlockingIOError:
            raise TowerbenchError(f"{refusal}: {_AGAIN}") from None
        yield
    finally:
        os.close(descriptor)


def fetch_staging_held(staging: Path, name: str) -> contextlib.AbstractContextManager[None]:
    """Hold a fetch's staging folder while it assembles dataset `name` there."""
    return _folder_held(staging, True, f"dataset {name!r} is being fetched by another command")


def dataset_written(data_dir: Path, name: str) -> contextlib.AbstractContextManager[None]:
    """Hold dataset `name`'s published folder while the block builds and swaps in its next
    version."""
    folder = dataset_dir(data_dir, name)
    doing = "is being read by a training or preprocessed by another command"
    return _folder_held(folder, True, f"dataset {name!r} in {folder} {doing}")


@contextlib.contextmanager
def datasets_read(data_dir: Path, names: Iterable[str]) -> Iterator[None]:
    """Hold each dataset in `names` shared while the block trains on them."""
    with contextlib.ExitStack() as stack:
        for name in dict.fromkeys(names):
            refusal = f"dataset {name!r} is being preprocessed by another command"
            stack.enter_context(_folder_held(dataset_dir(data_dir, name), False, refusal))
        yield
