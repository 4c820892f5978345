"""The TFRecord contract: round trip, determinism, atomic publishing, manifest errors."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from towerbench.core.errors import TowerbenchError
from towerbench.core.tfrecord_format import dataset_dir, load_manifest, split_files
from towerbench.ingest.write_records import write_dataset
from towerbench.model.tfrecords import decode_example


def _arrays(count: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (count, 6, 5, 3), dtype=np.uint8), rng.integers(0, 3, count)


def _write(folder, shards=3):
    splits = {"train": _arrays(20), "test": _arrays(7, seed=1)}
    manifest = write_dataset(folder, "toy", ["a", "b", "c"], splits, shards, {"url": "test"})
    return manifest, splits


def test_round_trip_restores_every_image_label_and_count(tmp_path):
    folder = dataset_dir(tmp_path, "toy")
    written, splits = _write(folder)
    manifest = load_manifest(folder)
    assert manifest == written
    assert manifest.image_shape == [6, 5, 3]
    for split, (images, labels) in splits.items():
        files = split_files(folder, manifest, split)
        dataset = tf.data.TFRecordDataset(files).map(
            lambda record: decode_example(record, manifest.image_shape),
            num_parallel_calls=tf.data.AUTOTUNE,
        )
        assert dataset.element_spec[0].shape == (6, 5, 3)
        decoded = list(dataset.as_numpy_iterator())
        # Shard k holds examples k, k+n, ...: sort back by content to compare as sets.
        got = sorted((image.tobytes(), int(label)) for image, label in decoded)
        assert got == sorted(
            (image.tobytes(), int(label)) for image, label in zip(images, labels, strict=True)
        )
        info = manifest.splits[split]
        assert info.examples == len(labels) == sum(f.examples for f in info.files)
        assert info.per_class == np.bincount(labels, minlength=3).tolist()
    all_train = splits["train"][0].reshape(-1, 3).astype(np.float64)
    np.testing.assert_allclose(manifest.mean, all_train.mean(axis=0), atol=1e-5)
    np.testing.assert_allclose(manifest.std, all_train.std(axis=0), atol=1e-5)


def test_decode_without_shape_reads_it_from_the_record(tmp_path):
    folder = tmp_path / "toy"
    _, splits = _write(folder, shards=1)
    files = split_files(folder, load_manifest(folder), "train")
    image, label = decode_example(next(iter(tf.data.TFRecordDataset(files))))
    np.testing.assert_array_equal(image.numpy(), splits["train"][0][0])
    assert label.dtype == tf.int32


def test_same_input_gives_byte_identical_files(tmp_path):
    first, _ = _write(tmp_path / "one")
    second, _ = _write(tmp_path / "two")
    assert first == second
    for name in sorted(p.name for p in (tmp_path / "one").iterdir()):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes()


def test_a_failed_write_leaves_the_previous_dataset_untouched(tmp_path):
    folder = tmp_path / "toy"
    before, _ = _write(folder)
    images, labels = _arrays(5)
    with pytest.raises(ValueError, match="labels outside"):
        write_dataset(folder, "toy", ["a"], {"train": (images, labels + 5)}, 2, {})
    assert load_manifest(folder) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["toy"]  # no temp folder left


def test_missing_or_invalid_manifest_is_one_line_error(tmp_path):
    with pytest.raises(TowerbenchError, match="no manifest"):
        load_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text('{"dataset": "x"}')
    with pytest.raises(TowerbenchError, match="invalid manifest"):
        load_manifest(tmp_path)
