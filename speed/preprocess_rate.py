"""CIFAR-10 binary archive -> TFRecords: the data layer's conversion, timed on random pixels."""

from __future__ import annotations

import io
import shutil
import tarfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from towerbench.ingest.cifar import CIFAR10, convert_archive
from towerbench.speed.timing import time_once

CIFAR10_CLASSES = (
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
)
RECORD_BYTES = 1 + 3 * 32 * 32  # <label byte><1024 red, 1024 green, 1024 blue>
TRAIN_FILES = 5  # data_batch_1..5.bin; the test split is one more file of the same size


def write_random_cifar10_archive(path: Path, images_per_file: int, seed: int = 0) -> int:
    """An archive of the official cifar-10-binary.tar.gz layout holding random pixels and labels.

    Returns the number of images (6 files of `images_per_file`: 5 train, 1 test). Random bytes do
    not compress, so gzip runs at its fastest level: only the member layout needs to be real.
    """
    rng = np.random.default_rng(seed)
    members = [f"data_batch_{index}.bin" for index in range(1, TRAIN_FILES + 1)]
    members.append("test_batch.bin")
    with tarfile.open(path, "w:gz", compresslevel=1) as tar:
        for name in members:
            records = rng.integers(0, 256, size=(images_per_file, RECORD_BYTES), dtype=np.uint8)
            records[:, 0] %= len(CIFAR10_CLASSES)
            _add_member(tar, f"cifar-10-batches-bin/{name}", records.tobytes())
        names = "\n".join(CIFAR10_CLASSES) + "\n"
        _add_member(tar, "cifar-10-batches-bin/batches.meta.txt", names.encode())
    return images_per_file * len(members)


def _add_member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def preprocess_runner(archive: Path, work_dir: Path, shards: int) -> Callable[[], float]:
    """A callable converting `archive` to TFRecords in a fresh folder; seconds per conversion."""

    def run() -> float:
        out_dir = work_dir / "tfrecords" / CIFAR10.name
        shutil.rmtree(out_dir, ignore_errors=True)
        return time_once(lambda: convert_archive(archive, out_dir, CIFAR10, shards))

    return run
