"""Dataset sources behind one interface: fetch raw data, then preprocess it into TFRecords.

    fetch(FetchConfig, data_dir)              -> DATA_DIR/raw/<name>/   (verified, + source.json)
    preprocess(name, PreprocessConfig, data_dir) -> DATA_DIR/tfrecords/<name>/ (+ manifest.json)

Both publish atomically: a failed step leaves nothing a later step would pick up.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from model.config import FetchConfig, PreprocessConfig
from model.errors import TowerbenchError
from model.sources.base import Source
from model.sources.cifar import CIFAR10, CIFAR100, CifarSource
from model.sources.digits import DigitsSource
from model.sources.imagefolder import ImageFolderSource
from model.sources.layout import (
    SOURCE_RECORD,
    ensure_writable,
    raw_dir,
    read_source_record,
    write_source_record,
)
from model.tfrecords import Manifest, dataset_dir, write_dataset

SOURCES: dict[str, Source] = {
    "digits": DigitsSource(),
    "cifar10": CifarSource(CIFAR10),
    "cifar100": CifarSource(CIFAR100),
    "imagefolder": ImageFolderSource(),
}


def source_for(name: str) -> Source:
    """The source called `name`, or a TowerbenchError listing the known ones."""
    if name not in SOURCES:
        raise TowerbenchError(f"unknown dataset {name!r} (choose from {', '.join(SOURCES)})")
    return SOURCES[name]


def dataset_name(config: FetchConfig) -> str:
    """Where `config`'s data is stored: its name, the imagefolder's stem, or the source name."""
    if config.name is not None:
        return config.name
    if config.source == "imagefolder" and config.url:
        return PurePosixPath(config.url.rstrip("/")).stem
    return config.source


def fetch(config: FetchConfig, data_dir: Path) -> Path:
    """Bring DATA_DIR/raw/<name>/ to what `config` describes; return that folder."""
    source = source_for(config.source)
    folder = ensure_writable(raw_dir(data_dir, dataset_name(config)))
    # Until the new record is written the folder counts as unfinished.
    (folder / SOURCE_RECORD).unlink(missing_ok=True)
    record = source.fetch(config, folder)
    write_source_record(folder, record)
    return folder


def preprocess(name: str, config: PreprocessConfig, data_dir: Path) -> Manifest:
    """Turn the fetched DATA_DIR/raw/<name>/ into DATA_DIR/tfrecords/<name>/."""
    folder = raw_dir(data_dir, name)
    if not folder.is_dir():
        raise TowerbenchError(
            f"{folder}: dataset {name!r} was not fetched; run `towerbench fetch` first"
        )
    record = read_source_record(folder)
    out_dir = dataset_dir(data_dir, name)
    ensure_writable(out_dir.parent)
    loaded = source_for(record["source"]).load(folder, record, config)
    return write_dataset(out_dir, name, loaded.classes, loaded.splits, config.shards, loaded.source)
