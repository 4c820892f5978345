"""Label rows in the data contract (issue 61 item 1): regression targets, one-hot or soft rows
and multi-hot tags go from arrays through the TFRecords and their manifest (`labels: rows`) to
the input pipeline as float32 rows; class ids keep their bytes and their manifest."""

from __future__ import annotations

import json

import numpy as np
import pytest

from towerbench.core.tfrecord_format import Features, load_manifest, split_files
from towerbench.ingest.arrays import check_arrays
from towerbench.ingest.write_records import write_dataset
from towerbench.model.input_pipeline import (
    Distortions,
    EpochPlan,
    evaluation_dataset,
    train_dataset,
)


def _examples(count: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((count, 5)).astype(np.float32)


def _arrays(y_train, y_test) -> dict[str, np.ndarray]:
    return {
        "x_train": _examples(len(y_train), 0),
        "y_train": y_train,
        "x_test": _examples(len(y_test), 1),
        "y_test": y_test,
    }


@pytest.mark.parametrize(
    ("y_train", "y_test", "width"),
    [
        (np.linspace(-2, 3, 40), np.linspace(0, 1, 7), 1),  # one regression target, float64
        (np.arange(80.0).reshape(40, 2), np.ones((7, 2), np.float16), 2),  # two targets
        (np.eye(3, dtype=bool)[np.arange(40) % 3], np.zeros((7, 3), bool), 3),  # one-hot, bool
        (np.arange(160).reshape(40, 4) % 2, np.ones((7, 4), np.int64), 4),  # multi-hot tags
    ],
)
def test_numeric_labels_are_float32_rows_named_by_column(y_train, y_test, width):
    splits, names = check_arrays(_arrays(y_train, y_test), "data")
    assert names == [str(column) for column in range(width)]
    for split, given in (("train", y_train), ("test", y_test)):
        labels = splits[split][1]
        assert labels.dtype == np.float32 and labels.shape == (len(given), width)
        np.testing.assert_array_equal(labels, np.asarray(given, np.float32).reshape(len(given), -1))


def test_class_ids_keep_their_bytes_and_manifest(tmp_path):
    """A (N, 1) integer column is still cifar10's class ids, and their manifest names no labels."""
    splits, names = check_arrays(_arrays(np.arange(40)[:, None] % 3, np.arange(7) % 3), "data")
    assert names == ["0", "1", "2"] and splits["train"][1].shape == (40,)
    write_dataset(tmp_path / "ids", "ids", names, splits, 2, {})
    assert "labels" not in json.loads((tmp_path / "ids" / "manifest.json").read_text())
    assert load_manifest(tmp_path / "ids").features == Features((5,), "float32")


def test_label_rows_travel_through_tfrecords_to_training_and_evaluation_batches(tmp_path):
    rng = np.random.default_rng(2)
    rows = {
        split: rng.random((count, 3)).astype(np.float32)
        for split, count in (("train", 40), ("test", 7))
    }
    rows["train"][:, 2] = 0.0  # per_class counts the examples whose column is not 0
    splits = {
        split: (_examples(len(values), index), values)
        for index, (split, values) in enumerate(rows.items())
    }
    manifest = write_dataset(tmp_path / "rows", "rows", ["a", "b", "c"], splits, 2, {})

    assert json.loads((tmp_path / "rows" / "manifest.json").read_text())["labels"] == "rows"
    loaded = load_manifest(tmp_path / "rows")
    assert loaded.features == Features((5,), "float32", label_columns=3)
    assert loaded.splits["train"].per_class == [40, 40, 0]
    every = np.concatenate(list(rows.values()))
    assert loaded.label_bounds == [float(every.min()), float(every.max())]
    assert loaded.rows_sum_to_one is False

    plan = EpochPlan(40, 8, towers=2)
    train_files = split_files(tmp_path / "rows", manifest, "train")
    batches = list(train_dataset(train_files, loaded.features, plan, Distortions(), 0, 0))
    seen = np.concatenate([labels.numpy() for _, labels in batches])
    assert seen.dtype == np.float32 and seen.shape == (40, 3)
    assert sorted(map(bytes, seen)) == sorted(map(bytes, rows["train"]))

    test_files = split_files(tmp_path / "rows", manifest, "test")
    evaluated = list(evaluation_dataset(test_files, loaded.features, None, 5))
    assert [tuple(labels.shape) for _, labels, _ in evaluated] == [(5, 3), (5, 3)]
    kept = np.concatenate([labels.numpy()[mask.numpy()] for _, labels, mask in evaluated])
    assert sorted(map(bytes, kept)) == sorted(map(bytes, rows["test"]))  # padding masked out


def test_a_split_of_rows_beside_one_of_class_ids_is_refused(tmp_path):
    splits = {
        "train": (_examples(4, 0), np.eye(2)[[0, 1, 0, 1]]),
        "test": (_examples(2, 1), [0, 1]),
    }
    with pytest.raises(ValueError, match="all splits must have class ids, or all label rows"):
        write_dataset(tmp_path / "mixed", "mixed", ["a", "b"], splits, 1, {})
    assert not (tmp_path / "mixed").exists()
