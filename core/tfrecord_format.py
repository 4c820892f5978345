"""The TFRecord data contract: sharded `tf.train.Example` files plus a `manifest.json`.

Layout: DATA_DIR/tfrecords/<name>/<split>-<i>-of-<n>.tfrecord and .../<name>/manifest.json.
Each example has three features:
  image  bytes   the example's values, row-major, little-endian, of the manifest's `dtype`
                 (uint8 H*W*C pixels for an image), uncompressed
  label  int64   index into the manifest's `classes` (manifest `labels: class_ids`), or
         float[] one value per name in `classes` (`labels: rows`: regression targets, one-hot or
                 soft class rows, multi-hot tags)
  shape  int64[] the example's shape ([H, W, C] for an image; any rank >= 1)
A manifest without `dtype` (every dataset before array sources) holds uint8 images; one
without `labels` holds class ids.

Written by ingest/write_records.py, decoded by model/tfrecords.py; this module (plain Python, no
TensorFlow) is the part both sides and the orchestration read: the layout, the manifest, the
shard checks. The manifest lists every shard's sha256; `verify_shards` checks them before a run
trusts the files (0.5-0.7 s for a CIFAR-10-sized 189 MB on 2 busy cores, against 186 s for one
epoch of the tutorial network).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from towerbench.core.errors import TowerbenchError

MANIFEST_NAME = "manifest.json"
FeatureDtype = Literal["uint8", "int32", "int64", "float16", "float32"]
FEATURE_DTYPES: tuple[str, ...] = ("uint8", "int32", "int64", "float16", "float32")
IMAGE_CHANNELS = (1, 3)
LabelKind = Literal["class_ids", "rows"]


@dataclass(frozen=True)
class Features:
    """What one example holds: its shape (without the example axis), dtype and label."""

    shape: tuple[int, ...]
    dtype: FeatureDtype = "uint8"
    label_columns: int | None = None  # a float32 label row's width; None: one class id

    @classmethod
    def of(cls, features: Features | Sequence[int]) -> Features:
        """`features`, or a bare shape as it always meant: uint8 pixels."""
        if isinstance(features, Features):
            return features
        return cls(tuple(int(size) for size in features))

    @property
    def is_image(self) -> bool:
        """uint8 (H, W, 1 or 3): what crops, flips and colour distortions apply to."""
        return self.dtype == "uint8" and len(self.shape) == 3 and self.shape[-1] in IMAGE_CHANNELS

    @property
    def integer(self) -> bool:
        """Integer values other than pixels (token ids): fed as int32, not as floats."""
        return self.dtype in ("int32", "int64")

    def describe(self) -> str:
        """`uint8 images 32x32x3` or `float32 features (20,)`."""
        if self.is_image:
            return f"uint8 images {'x'.join(map(str, self.shape))}"
        return f"{self.dtype} features {self.shape}"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ShardFile(_Strict):
    """One TFRecord file of a split."""

    path: str = Field(description="File name relative to the manifest's folder.")
    examples: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class SplitInfo(_Strict):
    """Counts and files of one split (train, test, ...)."""

    examples: int = Field(ge=1)
    per_class: list[int]
    files: list[ShardFile]


class Manifest(_Strict):
    """What a preprocessed dataset contains; `mean`/`std` are per channel (the last axis; on the
    0-255 scale for images), computed over the train split (or the first split when there is no
    train split). `image_shape` is one example's shape, `dtype` its values' type: an image's
    [H, W, C] of uint8 (the default, so manifests written before other dtypes read as before).
    `labels` says what a label is: a class id (the default) or a float row with one value per
    name in `classes` (then `per_class` counts the examples whose value there is not 0)."""

    dataset: str
    classes: list[str] = Field(min_length=1)
    image_shape: list[int] = Field(min_length=1)
    dtype: FeatureDtype = "uint8"
    labels: LabelKind = "class_ids"
    # Label rows only: their smallest and largest value, and whether every row sums to 1 (a
    # one-hot or soft class row): what the losses check their labels against.
    label_bounds: list[float] | None = None
    rows_sum_to_one: bool | None = None
    splits: dict[str, SplitInfo]
    mean: list[float]
    std: list[float]
    source: dict[str, Any]

    @property
    def features(self) -> Features:
        """Shape and dtype of one example: what the input pipeline and the network are given."""
        columns = len(self.classes) if self.labels == "rows" else None
        return Features(tuple(self.image_shape), self.dtype, columns)

    def to_json(self) -> str:
        """manifest.json's text; a uint8 dataset's has no `dtype`, byte for byte as before."""
        return json.dumps(self.model_dump(exclude_defaults=True), indent=2) + "\n"


def dataset_dir(data_dir: Path, name: str) -> Path:
    """The folder holding dataset `name`'s shards and manifest under DATA_DIR."""
    return Path(data_dir) / "tfrecords" / name


def load_manifest(dataset_dir: Path) -> Manifest:
    """Read and validate `dataset_dir/manifest.json`."""
    path = Path(dataset_dir) / MANIFEST_NAME
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise TowerbenchError(
            f"{path}: no manifest; run `towerbench preprocess` for this dataset first"
        ) from None
    except OSError as error:
        raise TowerbenchError(f"{path}: cannot read manifest ({error.strerror})") from None
    try:
        return Manifest.model_validate_json(text)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "document"
        raise TowerbenchError(f"{path}: invalid manifest at {where}: {first['msg']}") from None


def split_files(dataset_dir: Path, manifest: Manifest, split: str) -> list[str]:
    """Absolute paths of `split`'s TFRecord files, in shard order; each must exist."""
    if split not in manifest.splits:
        known = ", ".join(sorted(manifest.splits))
        raise TowerbenchError(
            f"{Path(dataset_dir) / MANIFEST_NAME}: no split {split!r} (has: {known})"
        )
    paths = [Path(dataset_dir) / shard.path for shard in manifest.splits[split].files]
    for path in paths:
        if not path.is_file():
            raise TowerbenchError(f"{path}: TFRecord file listed in the manifest is missing")
    return [str(path) for path in paths]


def file_sha256(path: Path) -> str:
    """The hex sha256 of the file at `path`, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def shard_problem(dataset_dir: Path, manifest: Manifest) -> tuple[Path, str] | None:
    """The first shard of `manifest` that is missing or whose sha256 differs from the one
    listed, and what is wrong with it; None when every shard is as preprocessing wrote it."""
    for split in manifest.splits.values():
        for shard in split.files:
            path = Path(dataset_dir) / shard.path
            try:
                if file_sha256(path) != shard.sha256:
                    return path, "is damaged: its sha256 is not the one manifest.json lists"
            except FileNotFoundError:
                return path, "listed in manifest.json is missing"
            except OSError as error:
                return path, f"cannot be read ({error.strerror or error})"
    return None


def shard_error(path: Path, what: str, dataset: str) -> TowerbenchError:
    """The one-line error for a shard of `dataset` at `path` that `what` says is unusable."""
    return TowerbenchError(
        f"{path}: TFRecord shard {what}; rebuild the dataset (`towerbench preprocess {dataset}`, "
        "or `dvc repro` in a DVC project)"
    )


def verify_shards(dataset_dir: Path, manifest: Manifest) -> None:
    """A TowerbenchError naming the first shard that is missing or not as its manifest says."""
    problem = shard_problem(dataset_dir, manifest)
    if problem is not None:
        raise shard_error(*problem, manifest.dataset)
