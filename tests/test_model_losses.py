"""train.loss (issue 61 item 1): each built-in loss against values computed by hand, gradcheck
passing for each at 2 and 4 towers, one-hot rows under categorical_crossentropy training as class
ids do under the default, and a loss that does not fit the dataset's labels refused in one line."""

from __future__ import annotations

import math

import fixtures_model
import numpy as np
import pytest

from towerbench.config.losses import EMBEDDING_PAIRS, LOSSES, chance_loss
from towerbench.config.sections import TrainConfig
from towerbench.core.errors import TowerbenchError
from towerbench.core.tfrecord_format import dataset_dir, load_manifest
from towerbench.ingest.write_records import write_dataset
from towerbench.model import training
from towerbench.model.gradcheck import run_gradcheck
from towerbench.model.losses import per_example_loss
from towerbench.model.training_data import (
    check_config_against_data,
    check_training_data,
)

# The means over examples; in_batch_softmax's are tests/test_retrieval.py's.
MEANS = tuple(name for name in LOSSES if name not in EMBEDDING_PAIRS)
OUTPUTS = np.array([[2.0, -1.0, 0.5], [0.0, 0.0, 3.0]], np.float32)
ROWS = np.array([[1.0, 0.0, 1.0], [0.2, 0.3, 0.5]], np.float32)


def _log_softmax(row):
    return [value - math.log(sum(math.exp(v) for v in row)) for value in row]


def _softplus(x):
    return math.log1p(math.exp(x))


def _huber(error):
    return 0.5 * error * error if abs(error) <= 1 else abs(error) - 0.5


def _row_mean(values) -> float:
    return sum(values) / len(values)


def _by_hand(name: str) -> list[float]:
    """Each example's loss, from the definitions, one number at a time."""
    if name == "sparse_categorical_crossentropy":
        return [
            -_log_softmax(out)[label] for out, label in zip(OUTPUTS.tolist(), [0, 2], strict=True)
        ]
    losses = []
    for out, row in zip(OUTPUTS.tolist(), ROWS.tolist(), strict=True):
        pairs = list(zip(out, row, strict=True))
        if name == "categorical_crossentropy":
            logs = _log_softmax(out)
            losses.append(-sum(y * logs[column] for column, y in enumerate(row)))
        elif name == "binary_crossentropy":  # -y log s(x) - (1-y) log(1-s(x)) = softplus(x) - yx
            losses.append(_row_mean([_softplus(x) - y * x for x, y in pairs]))
        else:
            error = {"mse": lambda e: e * e, "mae": abs, "huber": _huber}[name]
            losses.append(_row_mean([error(x - y) for x, y in pairs]))
    return losses


@pytest.mark.parametrize("name", MEANS)
def test_each_loss_matches_its_definition_computed_by_hand(name):
    labels = np.array([0, 2], np.int32) if name == "sparse_categorical_crossentropy" else ROWS
    computed = per_example_loss(name)(labels, OUTPUTS).numpy()
    assert computed.shape == (2,)
    np.testing.assert_allclose(computed, _by_hand(name), rtol=1e-6)


def test_chance_levels_are_the_loss_of_zero_logits():
    zeros = np.zeros((1, 4), np.float32)
    for name, labels in (
        ("sparse_categorical_crossentropy", np.array([3], np.int32)),
        ("categorical_crossentropy", np.eye(4, dtype=np.float32)[[1]]),
        ("binary_crossentropy", np.array([[1, 0, 0, 1]], np.float32)),
    ):
        assert float(per_example_loss(name)(labels, zeros)[0]) == pytest.approx(
            chance_loss(name, 4)
        )
    assert chance_loss("mse", 4) is None


DENSE = """
import keras

def build(input_shape, width):
    inputs = keras.Input(shape=input_shape)
    x = keras.layers.Flatten()(inputs)
    x = keras.layers.Dense(12, activation="tanh")(x)
    return keras.Model(inputs, keras.layers.Dense(width)(x))
"""


@pytest.mark.slow
@pytest.mark.parametrize("towers", [2, 4])
def test_gradcheck_passes_for_every_built_in_loss(tmp_path, towers):
    path = tmp_path / "dense.py"
    path.write_text(DENSE)
    for name in MEANS:
        result = run_gradcheck(
            f"{path}:build", towers, 16, seed=2, input_shape=(4, 4, 1), num_classes=3, loss=name
        )
        assert result.loss == name
        assert result.passed, (name, result.mean_vs_single.max_rel_diff)
        assert result.mean_vs_single.max_rel_diff <= 1e-5
        assert result.mirrored_vs_single.max_rel_diff <= 1e-5
        assert result.sum_vs_mean.ratio == pytest.approx(towers, rel=1e-5)


def _one_hot_copy(data_dir) -> None:
    """The digits fixture again as `digits_rows`, its class ids written as one-hot rows."""
    import tensorflow as tf

    from towerbench.core.tfrecord_format import split_files
    from towerbench.model.tfrecords import decode_example

    folder = dataset_dir(data_dir, "digits")
    manifest = load_manifest(folder)
    splits = {}
    for split in ("train", "test"):
        records = tf.data.TFRecordDataset(split_files(folder, manifest, split))
        pairs = [decode_example(r, manifest.features) for r in records]
        # Shard i % n order back to the input order: the rows' dataset gets the same shards.
        images = np.stack([p[0].numpy() for p in pairs])
        labels = np.array([int(p[1]) for p in pairs])
        splits[split] = (images, np.eye(10, dtype=np.float32)[labels])
    write_dataset(
        dataset_dir(data_dir, "digits_rows"), "digits_rows", manifest.classes, splits, 1, {}
    )
    ids = {split: (rows[0], rows[1].argmax(1)) for split, rows in splits.items()}
    write_dataset(dataset_dir(data_dir, "digits_ids"), "digits_ids", manifest.classes, ids, 1, {})


@pytest.mark.slow
def test_one_hot_rows_under_categorical_crossentropy_train_as_class_ids_do(tmp_path):
    data_dir = fixtures_model.write_digits(tmp_path, train=256, test=64)
    _one_hot_copy(data_dir)
    common = {"towers": 2, "global_batch": 64, "epochs": 1, "model": "tutorial", "crop_size": None}
    ids = training.train(TrainConfig(dataset="digits_ids", **common), data_dir)
    rows = training.train(
        TrainConfig(dataset="digits_rows", loss="categorical_crossentropy", **common), data_dir
    )
    for by_id, by_row in zip(ids.history, rows.history, strict=True):
        assert by_row.cross_entropy == pytest.approx(by_id.cross_entropy, rel=1e-5)
        assert by_row.train_accuracy == by_id.train_accuracy
        assert by_row.test_accuracy == by_id.test_accuracy
        assert by_row.test_cross_entropy == pytest.approx(by_id.test_cross_entropy, rel=1e-5)
    np.testing.assert_array_equal(rows.confusion_matrix, ids.confusion_matrix)


def test_a_loss_that_does_not_fit_the_labels_is_refused_in_one_line(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((20, 3)).astype(np.float32)
    rows = {"train": (x, rng.random((20, 2))), "test": (x[:4], rng.random((4, 2)))}
    write_dataset(tmp_path / "rows", "rows", ["a", "b"], rows, 1, {})
    ids = {"train": (x, np.arange(20) % 2), "test": (x[:4], np.arange(4) % 2)}
    write_dataset(tmp_path / "ids", "ids", ["a", "b"], ids, 1, {})
    tags = {
        "train": (x, np.maximum(np.eye(2)[np.arange(20) % 2], (np.arange(20) % 4 == 0)[:, None]))
    }
    tags["test"] = (x[:4], np.ones((4, 2)))  # multi-hot: rows of 0/1 summing to 1 or 2
    write_dataset(tmp_path / "tags", "tags", ["a", "b"], tags, 1, {})
    targets = {"train": (x, 5 * rng.standard_normal((20, 2))), "test": (x[:4], np.ones((4, 2)))}
    write_dataset(tmp_path / "targets", "targets", ["a", "b"], targets, 1, {})
    floats = {"train": (x, (np.arange(20) % 2.0)[:, None]), "test": (x[:4], np.zeros((4, 1)))}
    write_dataset(tmp_path / "floats", "floats", ["0"], floats, 1, {})  # class ids as floats
    expected = {
        ("rows", "sparse_categorical_crossentropy", "auto"): "--loss "
        "sparse_categorical_crossentropy takes class ids, 'rows' holds label rows of 2 columns: "
        "use categorical_crossentropy (one-hot or soft rows), binary_crossentropy (0/1 rows) or "
        "mse, mae, huber (targets)",
        ("ids", "categorical_crossentropy", "auto"): "--loss categorical_crossentropy takes "
        "label rows, 'ids' holds class ids: use sparse_categorical_crossentropy",
        ("rows", "mse", "accuracy"): "--metric accuracy does not fit --loss mse: it is judged "
        "by mae or rmse",
        ("rows", "binary_crossentropy", "rmse"): "--metric rmse does not fit --loss "
        "binary_crossentropy: it is judged by binary_accuracy or auc",
        ("ids", "m.py:my_loss", "mae"): "--metric mae does not fit --loss m.py:my_loss: it is "
        "judged by accuracy",
        ("rows", "m.py:my_loss", "auto"): "--metric: your loss m.py:my_loss on label rows has "
        "no metric of its own: pass --metric binary_accuracy or auc or mae or rmse",
        ("floats", "sparse_categorical_crossentropy", "auto"): "--loss "
        "sparse_categorical_crossentropy takes class ids, 'floats' holds label rows of 1 "
        "column: use mse, mae or huber (a target column: class ids given as floats are read "
        "so; give them as integers, y.astype(int))",
        ("floats", "categorical_crossentropy", "auto"): "--loss categorical_crossentropy: "
        "'floats' holds label rows of 1 column, and a class per example needs 2 columns or more",
        ("tags", "categorical_crossentropy", "auto"): "--loss categorical_crossentropy takes "
        "rows that sum to 1 (one-hot or soft classes), 'tags' has rows that do not: "
        "binary_crossentropy takes multi-hot tags",
        ("targets", "binary_crossentropy", "auto"): "--loss binary_crossentropy takes labels in "
        "[0, 1], 'targets' holds values from ",
        ("targets", "m.py:my_loss", "auc"): "--metric auc takes labels in [0, 1]",
    }
    for (dataset, loss, metric), message in expected.items():
        config = TrainConfig(
            dataset=dataset, loss=loss, metric=metric, model="m.py:build", global_batch=4
        )
        with pytest.raises(TowerbenchError) as raised:
            check_config_against_data(config, load_manifest(tmp_path / dataset))
        assert str(raised.value).startswith(message) and "\n" not in str(raised.value)
    soft = {
        split: (values, labels / labels.sum(1, keepdims=True))
        for split, (values, labels) in rows.items()
    }
    write_dataset(tmp_path / "soft", "soft", ["a", "b"], soft, 1, {})
    for dataset, loss in (("tags", "binary_crossentropy"), ("soft", "categorical_crossentropy")):
        fits = TrainConfig(dataset=dataset, loss=loss, model="m.py:build", global_batch=4)
        check_config_against_data(fits, load_manifest(tmp_path / dataset))  # taken
    mse = TrainConfig(dataset="rows", loss="mse", model="m.py:build", global_batch=4)
    (tmp_path / "tfrecords").symlink_to(tmp_path)  # the data dir's layout
    check_training_data([mse], tmp_path)  # train, sweeps and advise take it
    huber = mse.model_copy(update={"loss": "huber", "metric": "rmse"})
    with pytest.raises(TowerbenchError) as raised:  # a sweep's report compares one metric
        check_training_data([mse, huber], tmp_path)
    message = str(raised.value)
    assert message.startswith("the sweep's configurations are judged by mae (--loss mse) and ")
    assert "rmse (--loss huber)" in message and "\n" not in message
