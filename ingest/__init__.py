"""Dataset sources behind one interface: fetch raw data, then preprocess it into TFRecords.

    fetch(FetchConfig, data_dir)              -> DATA_DIR/raw/<name>/   (verified, + source.json)
    preprocess(name, PreprocessConfig, data_dir) -> DATA_DIR/tfrecords/<name>/ (+ manifest.json)

Both publish atomically: a failed step leaves nothing a later step would pick up, and the
previous version of its output, if any, as it was. A full disk is one line naming the folder.
Both hold the dataset's lock (core/dataset_lock.py): never while a training reads it, never two
at once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from towerbench.config.names import name_problem
from towerbench.config.sections import FetchConfig, PreprocessConfig, dataset_name
from towerbench.core.dataset_lock import dataset_written, fetch_staging_held
from towerbench.core.errors import TowerbenchError
from towerbench.core.files import no_new_empty_folders, replace_folder, space_errors
from towerbench.core.tfrecord_format import Manifest, dataset_dir
from towerbench.ingest.arrays import ArraysSource
from towerbench.ingest.base import Source
from towerbench.ingest.cifar import CIFAR10, CIFAR100, CifarSource
from towerbench.ingest.digits import DigitsSource
from towerbench.ingest.imagefolder import ImageFolderSource
from towerbench.ingest.layout import (
    discard_staging,
    ensure_writable,
    link_previous,
    raw_dir,
    read_source_record,
    staging_dir,
    write_source_record,
)
from towerbench.ingest.write_records import write_dataset

SOURCES: dict[str, Source] = {
    "digits": DigitsSource(),
    "cifar10": CifarSource(CIFAR10),
    "cifar100": CifarSource(CIFAR100),
    "imagefolder": ImageFolderSource(),
    "arrays": ArraysSource(),
}


def source_for(name: str) -> Source:
    """The source called `name`, or a TowerbenchError listing the known ones."""
    if name not in SOURCES:
        raise TowerbenchError(f"unknown dataset {name!r} (choose from {', '.join(SOURCES)})")
    return SOURCES[name]


def fetch(config: FetchConfig, data_dir: Path) -> Path:
    """Bring DATA_DIR/raw/<name>/ to what `config` describes; return that folder.

    The new version is assembled beside it and swapped in whole, so a failed fetch leaves the
    previous one as it was (and no empty folder); only a resumable partial download stays.
    """
    source = source_for(config.source)
    folder = raw_dir(data_dir, dataset_name(config))
    with no_new_empty_folders(staging_dir(folder)):
        staging = ensure_writable(staging_dir(folder))
        with fetch_staging_held(staging, dataset_name(config)):
            return _fetch_into(source, config, staging, folder)


def _fetch_into(source: Source, config: FetchConfig, staging: Path, folder: Path) -> Path:
    """Assemble the new version in `staging`, then swap it in as `folder`."""
    try:
        with space_errors(folder, what="the fetched dataset"):
            link_previous(folder, staging)
            record = source.fetch(config, staging)
            write_source_record(staging, record)
            replace_folder(staging, folder)
    except BaseException:
        discard_staging(staging)
        raise
    return folder


def fetched_record(name: str, data_dir: Path) -> dict[str, Any]:
    """The source record of the fetched dataset `name`, or a one-line error (a name against the
    rule, nothing fetched): what `preprocess` checks before it loads anything."""
    problem = name_problem(name)
    if problem is not None:
        raise TowerbenchError(f"NAME: {problem} (got {name!r})")
    folder = raw_dir(data_dir, name)
    if not folder.is_dir():
        raise TowerbenchError(
            f"{folder}: dataset {name!r} was not fetched; run `towerbench fetch` first"
        )
    return read_source_record(folder)


def preprocess(name: str, config: PreprocessConfig, data_dir: Path) -> Manifest:
    """Turn the fetched DATA_DIR/raw/<name>/ into DATA_DIR/tfrecords/<name>/."""
    record = fetched_record(name, data_dir)
    folder = raw_dir(data_dir, name)
    out_dir = dataset_dir(data_dir, name)
    with dataset_written(data_dir, name), no_new_empty_folders(out_dir):
        ensure_writable(out_dir.parent)
        loaded = source_for(record["source"]).load(folder, record, config)
        return write_dataset(
            out_dir, name, loaded.classes, loaded.splits, config.shards, loaded.source
        )
