"""CIFAR-10 and CIFAR-100 from their official *binary* archives.

Records are fixed-size: CIFAR-10 is <label byte><3072 pixel bytes>, CIFAR-100 is <coarse byte>
<fine byte><3072 pixel bytes>; pixels are planar (1024 red, 1024 green, 1024 blue, row-major).
Whole files are decoded at once with numpy (reshape + transpose to NHWC), so 60,000 images
cost one copy, not 60,000 Python calls.

CIFAR-100 keeps both label sets in the archive; `PreprocessConfig.label_set` picks which one the
TFRecords carry: the 100 fine classes by default, or the 20 coarse superclasses.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from towerbench.config.sections import FetchConfig, PreprocessConfig
from towerbench.core.errors import TowerbenchError
from towerbench.core.tfrecord_format import Manifest
from towerbench.ingest.archives import read_tar
from towerbench.ingest.base import LoadedDataset
from towerbench.ingest.download import fetch_file, file_md5
from towerbench.ingest.write_records import write_dataset

_SIDE = 32
_PIXELS = 3 * _SIDE * _SIDE


@dataclass(frozen=True)
class CifarFormat:
    """What one official binary archive contains."""

    name: str
    url: str
    md5: str
    splits: dict[str, tuple[str, ...]]  # split -> record files
    label_files: dict[str, str]  # label set -> file of class names, one per line
    label_offsets: dict[str, int]  # label set -> byte of the record holding that label

    @property
    def archive_name(self) -> str:
        return PurePosixPath(self.url).name

    @property
    def record_bytes(self) -> int:
        return len(self.label_offsets) + _PIXELS

    def label_file(self, label_set: str) -> str:
        # CIFAR-10 has one label set; any choice means it.
        return self.label_files.get(label_set, next(iter(self.label_files.values())))

    def label_offset(self, label_set: str) -> int:
        return self.label_offsets.get(label_set, next(iter(self.label_offsets.values())))


CIFAR10 = CifarFormat(
    name="cifar10",
    url="https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz",
    md5="c32a1d4ab5d03f1284b67883e8d87530",
    splits={
        "train": tuple(f"data_batch_{index}.bin" for index in range(1, 6)),
        "test": ("test_batch.bin",),
    },
    label_files={"fine": "batches.meta.txt"},
    label_offsets={"fine": 0},
)
CIFAR100 = CifarFormat(
    name="cifar100",
    url="https://www.cs.toronto.edu/~kriz/cifar-100-binary.tar.gz",
    md5="03b5dce01913d631647c71ecec9e9cb8",
    splits={"train": ("train.bin",), "test": ("test.bin",)},
    label_files={"fine": "fine_label_names.txt", "coarse": "coarse_label_names.txt"},
    label_offsets={"coarse": 0, "fine": 1},
)


def _class_names(archive: Path, member: str, data: bytes) -> list[str]:
    names = [line.strip() for line in data.decode("utf-8", "replace").splitlines()]
    names = [name for name in names if name]
    if not names:
        raise TowerbenchError(f"{archive}: {member} lists no class names")
    return names


def _decode_records(
    archive: Path, member: str, data: bytes, fmt: CifarFormat, label_offset: int, classes: int
) -> tuple[np.ndarray, np.ndarray]:
    """One record file -> (uint8 [N, 32, 32, 3], int64 [N]) in file order."""
    if len(data) == 0 or len(data) % fmt.record_bytes:
        raise TowerbenchError(
            f"{archive}: {member} has {len(data)} bytes, not a multiple of the "
            f"{fmt.record_bytes}-byte {fmt.name} record"
        )
    rows = np.frombuffer(data, dtype=np.uint8).reshape(-1, fmt.record_bytes)  # [N, record]
    labels = rows[:, label_offset].astype(np.int64)
    if labels.max() >= classes:
        raise TowerbenchError(
            f"{archive}: {member} has label {labels.max()} but only {classes} class names"
        )
    planar = rows[:, len(fmt.label_offsets) :].reshape(-1, 3, _SIDE, _SIDE)  # [N, C, H, W]
    return planar.transpose(0, 2, 3, 1), labels  # [N, H, W, C], a view until concatenated


def load_archive(archive: Path, fmt: CifarFormat, label_set: str = "fine") -> LoadedDataset:
    """Decode an official-format binary archive (checked member by member) into arrays."""
    label_file = fmt.label_file(label_set)
    wanted = {label_file, *(member for files in fmt.splits.values() for member in files)}
    members = read_tar(archive, wanted)
    classes = _class_names(archive, label_file, members[label_file])
    splits = {}
    for split, files in fmt.splits.items():
        parts = [
            _decode_records(
                archive, member, members.pop(member), fmt, fmt.label_offset(label_set), len(classes)
            )
            for member in files
        ]
        images = np.concatenate([images for images, _ in parts])  # one contiguous NHWC copy
        labels = np.concatenate([labels for _, labels in parts])
        splits[split] = (images, labels)
    source: dict[str, Any] = {"source": fmt.name, "archive": archive.name}
    if len(fmt.label_files) > 1:
        source["label_set"] = label_set
    return LoadedDataset(classes=classes, splits=splits, source=source)


def convert_archive(
    archive: Path, out_dir: Path, fmt: CifarFormat = CIFAR10, shards: int = 4
) -> Manifest:
    """Official binary archive -> TFRecords + manifest in `out_dir` (what the benchmark times)."""
    loaded = load_archive(archive, fmt)
    return write_dataset(out_dir, fmt.name, loaded.classes, loaded.splits, shards, loaded.source)


class CifarSource:
    """Downloads (or copies) one official archive into the raw folder, verified and checked."""

    def __init__(self, fmt: CifarFormat) -> None:
        self.fmt = fmt

    def _check(self, path: Path) -> None:
        load_archive(path, self.fmt)

    def fetch(self, config: FetchConfig, folder: Path) -> dict[str, Any]:
        url = config.url or self.fmt.url
        md5 = (config.md5 or self.fmt.md5).lower()
        archive = folder / self.fmt.archive_name
        if not (archive.is_file() and file_md5(archive) == md5):
            fetch_file(url, archive, md5, config.retries, check=self._check)
        return {"source": self.fmt.name, "url": url, "md5": md5, "archive": archive.name}

    def load(self, folder: Path, record: dict[str, Any], config: PreprocessConfig) -> LoadedDataset:
        loaded = load_archive(folder / record["archive"], self.fmt, config.label_set)
        return LoadedDataset(loaded.classes, loaded.splits, {**record, **loaded.source})
