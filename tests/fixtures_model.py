"""Shared pieces of the model tests: tiny TFRecord datasets of the real digits, how many
logical CPU devices the test session has (conftest.py asks for them), and the one
MirroredStrategy over them."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.datasets import load_digits

from towerbench.core.tfrecord_format import dataset_dir
from towerbench.ingest.write_records import write_dataset

LOGICAL_CPUS = 4


@cache
def mirrored_strategy() -> Any:
    """One MirroredStrategy over the logical CPUs for the whole process: a second one over the
    same devices reuses its collectives' instance keys and fails on the first all-reduce of
    another shape (tensorflow/tensorflow#62790)."""
    import tensorflow as tf

    return tf.distribute.MirroredStrategy([f"/cpu:{index}" for index in range(LOGICAL_CPUS)])


def write_digits(
    data_dir: Path, train: int = 600, test: int = 103, shards: int = 2, name: str = "digits"
) -> Path:
    """sklearn's 8x8 digits as DATA_DIR/tfrecords/<name> (`train` + `test` examples), scaled
    from 0-16 to 0-255 as the embedded `digits` source does."""
    digits = load_digits()
    images = np.round(digits.images * 255 / 16).astype(np.uint8)[..., None]  # (N, 8, 8, 1)
    order = np.random.default_rng(0).permutation(len(images))
    images, labels = images[order], digits.target[order]
    write_dataset(
        dataset_dir(data_dir, name),
        name,
        [str(digit) for digit in range(10)],
        {
            "train": (images[:train], labels[:train]),
            "test": (images[train : train + test], labels[train : train + test]),
        },
        shards,
        {"kind": "sklearn.load_digits", "test": "fixture"},
    )
    return data_dir


def write_digits_project(project: Path, params_yaml: str, train: int, test: int) -> Path:
    """A project folder: `params_yaml` as params.yaml and a digits fixture in its data/."""
    write_digits(project / "data", train=train, test=test)
    (project / "params.yaml").write_text(params_yaml)
    return project / "params.yaml"
