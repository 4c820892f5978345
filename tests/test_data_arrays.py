"""The arrays source (issue 37): arrays of any rank and dtype checked in one line each, saved once
as an .npz, fetched and preprocessed into TFRecords whose manifest records dtype and shape, fed by
the input pipeline as they are (distortions for uint8 images only), trained from the CLI with a
user's model, and versioned by real DVC."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import yaml

from towerbench.cli.main import main
from towerbench.config.sections import PreprocessConfig, TrainConfig
from towerbench.core.errors import TowerbenchError
from towerbench.core.tfrecord_format import Features, dataset_dir, load_manifest, split_files
from towerbench.ingest import fetch, preprocess
from towerbench.ingest.arrays import fetch_config, save_arrays
from towerbench.model.input_pipeline import (
    Distortions,
    EpochPlan,
    evaluation_dataset,
    network_input_shape,
    train_dataset,
)
from towerbench.model.training_data import check_config_against_data, distortions_note
from towerbench.tasks.data.dvc_stages import DataStages, data_stages, run_dvc, update_dataset

TOWERBENCH = Path(sys.executable).with_name("towerbench")  # the console script users run
PROJECT = Path(__file__).resolve().parents[1]

TABULAR_MODEL = """
import keras

def build(input_shape, num_classes):
    inputs = keras.Input(shape=input_shape)
    x = keras.layers.Dense(16, activation="relu")(inputs)
    return keras.Model(inputs, keras.layers.Dense(num_classes)(x))
"""
TOKEN_MODEL = """
import keras

def build(input_shape, num_classes):
    inputs = keras.Input(shape=input_shape, dtype="int32")
    x = keras.layers.Embedding(50, 8)(inputs)
    x = keras.layers.GlobalAveragePooling1D()(x)
    return keras.Model(inputs, keras.layers.Dense(num_classes)(x))
"""


def tabular(train: int = 200, test: int = 64, features: int = 20):
    """float32 (N, features), 3 classes from the first feature: Keras' load_data() shape."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((train + test, features)).astype(np.float32)
    y = np.digitize(x[:, 0], [-0.5, 0.5]).astype(np.uint8)  # uint8 labels, as mnist.npz's
    return (x[:train], y[:train]), (x[train:], y[train:])


def tokens(train: int = 200, test: int = 64, length: int = 30):
    """int32 token ids (N, length) in 0..49 whose class sets which half of the ids appear."""
    rng = np.random.default_rng(1)
    y = rng.integers(0, 2, train + test)
    x = (rng.integers(0, 25, (train + test, length)) + 25 * y[:, None]).astype(np.int32)
    return (x[:train], y[:train, None]), (x[train:], y[train:, None])  # (N, 1): as cifar10's


def write_npz(path: Path, train, test, **drop_or_replace) -> Path:
    arrays = dict(x_train=train[0], y_train=train[1], x_test=test[0], y_test=test[1])
    arrays |= drop_or_replace
    np.savez(path, **{key: value for key, value in arrays.items() if value is not None})
    return path


def _nan_at_3(x):
    x = x.copy()
    x[3, 5] = np.nan
    return x


def _inf_in_test(x):
    x = x.copy()
    x[0, 0] = np.inf
    return x


# (what to change in tabular(), what the one line says)
BAD = {
    "lengths differ": (
        lambda tr, te: ((tr[0], tr[1][:-1]), te),
        "y_train: 199 labels for the 200 examples of x_train",
    ),
    "text labels": (
        lambda tr, te: ((tr[0], tr[1].astype(str)), te),
        "y_train: labels are <U3; give integer class ids 0..K-1 or numeric rows",
    ),
    "label rows of two widths": (
        lambda tr, te: ((tr[0], np.eye(3)[tr[1]]), (te[0], np.eye(4)[te[1]])),
        "y_test: label rows of 4 columns, y_train's have 3",
    ),
    "label rows beside class ids": (
        lambda tr, te: ((tr[0], np.eye(3)[tr[1]]), te),
        "y_test: class ids, y_train's are label rows",
    ),
    "NaN in a target": (
        lambda tr, te: (tr, (te[0], np.where(np.arange(len(te[1])) == 2, np.nan, 1.0))),
        "y_test: NaN or inf in the labels (example 2, as float32)",
    ),
    "negative labels": (
        lambda tr, te: (tr, (te[0], te[1].astype(np.int64) - 1)),
        "y_test: negative label -1",
    ),
    "labels beyond train's classes": (
        lambda tr, te: (tr, (te[0], te[1] + 3)),
        "y_test: label 5, but y_train's largest is 2 (3 classes implied)",
    ),
    "a label far beyond the others": (  # {0, 1, 2, 10}: 11 classes, 7 of them empty
        lambda tr, te: ((tr[0], np.where(tr[1] == 2, 10, tr[1])), te),
        "y_train: label 10 implies 11 classes, but 8 of them have no example (2, 3, 4, 5, 6 "
        "and 3 more); labels must be 0..K-1, each present",
    ),
    "NaN in features": (
        lambda tr, te: ((_nan_at_3(tr[0]), tr[1]), te),
        "x_train: NaN or inf in the features (example 3)",
    ),
    "inf in features": (
        lambda tr, te: (tr, (_inf_in_test(te[0]), te[1])),
        "x_test: NaN or inf in the features (example 0)",
    ),
    "float64 features": (
        lambda tr, te: ((tr[0].astype(np.float64), tr[1]), te),
        "x_train: dtype float64 is not one of uint8, int32, int64, float16, float32",
    ),
    "rank 1": (
        lambda tr, te: ((tr[0][:, 0], tr[1]), te),
        "x_train: shape (200,) has no axis beyond the examples'",
    ),
    "shapes differ": (
        lambda tr, te: (tr, (te[0][:, :19], te[1])),
        "x_test: examples of shape (19,) float32, x_train's are (20,) float32",
    ),
}


@pytest.mark.parametrize("case", list(BAD))
@pytest.mark.slow
def test_bad_arrays_are_one_line_from_python_and_exit_2_from_the_cli(tmp_path, case):
    change, message = BAD[case]
    train, test = change(*tabular())
    with pytest.raises(TowerbenchError) as raised:
        save_arrays(train, test, tmp_path / "data", "bad")
    assert str(raised.value).startswith(f"data: {message}") and "\n" not in str(raised.value)
    assert not list((tmp_path / "data").glob("**/*.npz"))

    path = write_npz(tmp_path / "bad.npz", train, test)
    result = subprocess.run(
        [str(TOWERBENCH), "fetch", "arrays", "--url", str(path), "--data-dir", "data"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"towerbench fetch: error: {path}: {message}")
    assert result.stderr.count("\n") == 1
    assert not (tmp_path / "data" / "raw" / "bad").exists()  # nothing published


@pytest.mark.slow
def test_an_npz_missing_a_key_or_not_an_npz_is_one_line(tmp_path):
    train, test = tabular()
    missing = write_npz(tmp_path / "four.npz", train, test, y_test=None)
    not_npz = tmp_path / "x.npz"
    not_npz.write_bytes(b"not a zip")
    plain = tmp_path / "plain.npy"  # one array: np.load gives no archive
    np.save(plain, train[0])
    for path, message in (
        (missing, f"{missing}: no 'y_test' array (an .npz needs x_train, y_train, x_test, y_test"),
        (not_npz, f"{not_npz}: not a readable .npz ("),
        (plain, f"{plain}: a single array, not an .npz of x_train, y_train, x_test, y_test"),
    ):
        result = subprocess.run(
            [str(TOWERBENCH), "fetch", "arrays", "--url", str(path), "--data-dir", "data"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            check=False,
        )
        assert result.returncode == 2
        assert result.stderr.startswith(f"towerbench fetch: error: {message}")
        assert result.stderr.count("\n") == 1


def test_the_same_arrays_reuse_their_file_and_others_under_that_name_are_refused(tmp_path):
    train, test = tabular()
    path = save_arrays(train, test, tmp_path, "tab")
    assert path == tmp_path / "arrays" / "tab.npz"
    written = path.read_bytes()
    # Labels as int64 (N, 1) are the same arrays: the same bytes, the file reused.
    assert save_arrays(train, (test[0], test[1].astype(np.int64)[:, None]), tmp_path, "tab") == path
    assert path.read_bytes() == written
    with pytest.raises(TowerbenchError, match=r"^name 'tab': .*tab\.npz holds other arrays"):
        save_arrays((train[0] + 1, train[1]), test, tmp_path, "tab")
    assert path.read_bytes() == written
    # Without a name, the content names it: the same arrays, the same name.
    unnamed = save_arrays(train, test, tmp_path)
    assert unnamed.name == f"arrays-{hashlib.md5(written).hexdigest()[:12]}.npz"
    assert sorted(p.name for p in path.parent.iterdir()) == sorted(["tab.npz", unnamed.name])
    with np.load(path) as arrays:
        assert sorted(arrays.files) == ["x_test", "x_train", "y_test", "y_train"]
        np.testing.assert_array_equal(arrays["x_train"], train[0])
    with pytest.raises(TowerbenchError, match="^name: not a valid dataset name"):
        save_arrays(train, test, tmp_path, "../up")


def _preprocessed(tmp_path: Path, name: str, train, test) -> Path:
    data = tmp_path / "data"
    fetch(fetch_config(save_arrays(train, test, data, name), name), data)
    preprocess(name, PreprocessConfig(shards=3), data)
    return dataset_dir(data, name)


def test_tabular_and_token_arrays_become_tfrecords_the_pipeline_feeds_as_they_are(tmp_path):
    for name, (train, test), dtype, fed in (
        ("tab", tabular(), "float32", "float32"),
        ("tok", tokens(), "int32", "int32"),
        ("tok64", [(x.astype(np.int64), y) for x, y in tokens()], "int64", "int32"),
        ("half", [(x.astype(np.float16), y) for x, y in tabular()], "float16", "float32"),
    ):
        folder = _preprocessed(tmp_path, name, train, test)
        manifest = load_manifest(folder)
        text = json.loads((folder / "manifest.json").read_text())
        assert (text["dtype"], text["image_shape"]) == (dtype, list(train[0].shape[1:]))
        assert manifest.features == Features(train[0].shape[1:], dtype)
        assert manifest.classes == [str(label) for label in range(int(train[1].max()) + 1)]
        assert len(manifest.splits["train"].files) == 3
        assert network_input_shape(manifest.features, 24) == train[0].shape[1:]  # no crop

        plan = EpochPlan(manifest.splits["train"].examples, 64, towers=2)
        files = split_files(folder, manifest, "train")
        batches = list(train_dataset(files, manifest.features, plan, Distortions(), 0, 0))
        values, labels = batches[0]
        assert (values.shape, values.dtype.name, labels.dtype.name) == (
            (64, *train[0].shape[1:]),
            fed,
            "int32",
        )
        seen = np.concatenate([batch[0].numpy() for batch in batches])
        expected = train[0].astype(fed)
        assert sorted(map(bytes, seen)) == sorted(map(bytes, expected))  # fed undistorted
        test_files = split_files(folder, manifest, "test")
        evaluated = list(evaluation_dataset(test_files, manifest.features, 24, 50))
        assert [tuple(batch[0].shape) for batch in evaluated] == [(50, *test[0].shape[1:])] * 2
        assert {batch[0].dtype.name for batch in evaluated} == {fed}
        kept = np.concatenate([labels[mask] for _, labels, mask in evaluated])
        assert sorted(kept) == sorted(np.ravel(test[1]))  # the padding masked out


def test_uint8_images_keep_their_manifest_and_distortions(tmp_path):
    """A uint8 (H, W, C) dataset is an image dataset as before: no `dtype` in its manifest,
    crops apply; uint8 without a channel axis (mnist's (28, 28)) is fed whole as float32."""
    rng = np.random.default_rng(2)
    images = rng.integers(0, 256, (120, 10, 10, 3), dtype=np.uint8)
    labels = np.arange(120) % 4
    folder = _preprocessed(
        tmp_path, "img", (images[:100], labels[:100]), (images[100:], labels[100:])
    )
    assert "dtype" not in json.loads((folder / "manifest.json").read_text())
    manifest = load_manifest(folder)
    assert manifest.features.is_image and network_input_shape(manifest.features, 8) == (8, 8, 3)
    assert distortions_note(TrainConfig(dataset="img"), tmp_path / "data") is None
    assert network_input_shape([10, 10, 3], 8) == (8, 8, 3)  # a bare shape: pixels, as ever
    plan = EpochPlan(100, 20, towers=1)
    files = split_files(folder, manifest, "train")
    values, _ = next(iter(train_dataset(files, manifest.features, plan, Distortions(8), 0, 0)))
    assert values.shape == (20, 8, 8, 3) and values.dtype.name == "float32"

    grey = images[..., 0]
    folder = _preprocessed(tmp_path, "grey", (grey[:100], labels[:100]), (grey[100:], labels[100:]))
    manifest = load_manifest(folder)
    assert not manifest.features.is_image and manifest.dtype == "uint8"
    files = split_files(folder, manifest, "train")
    values, _ = next(iter(train_dataset(files, manifest.features, plan, Distortions(8), 0, 0)))
    assert values.shape == (20, 10, 10) and float(values.numpy().max()) > 200  # not standardised


def test_training_settings_the_arrays_cannot_serve_are_refused(tmp_path):
    folder = _preprocessed(tmp_path, "tab", *tabular())
    manifest = load_manifest(folder)
    model = f"{tmp_path / 'net.py'}:build"
    with pytest.raises(TowerbenchError, match=r"^--global-batch 256 exceeds the 200 training ex"):
        check_config_against_data(
            TrainConfig(dataset="tab", model=model, global_batch=256), manifest
        )
    with pytest.raises(TowerbenchError, match=r"^--model tutorial: a built-in network takes im"):
        check_config_against_data(TrainConfig(dataset="tab", global_batch=32), manifest)
    check_config_against_data(TrainConfig(dataset="tab", model=model, global_batch=32), manifest)
    note = distortions_note(TrainConfig(dataset="tab"), tmp_path / "data")
    assert note == (
        "input: 'tab' holds float32 features (20,): crops, flips and colour distortions are off "
        "(they apply to uint8 images (H, W, 1 or 3) only)"
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("arrays", "model"), [(tabular, TABULAR_MODEL), (tokens, TOKEN_MODEL)], ids=["tab", "tok"]
)
def test_cli_fetches_preprocesses_and_trains_a_user_model_on_arrays(
    tmp_path, capfd, monkeypatch, arrays, model
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "net.py").write_text(textwrap.dedent(model))
    write_npz(tmp_path / "x.npz", *arrays())
    assert main(["fetch", "arrays", "--url", "x.npz"]) == 0
    assert main(["preprocess", "x"]) == 0
    status = main(
        ["train", "--dataset", "x", "--model", "net.py:build", "--towers", "2"]
        + ["--global-batch", "32", "--epochs", "1", "--json"]
    )
    captured = capfd.readouterr()
    assert status == 0, captured.err[-3000:]
    result = json.loads(captured.out.strip().splitlines()[-1])
    assert (result["status"], result["test_examples"]) == ("completed", 64)
    assert result["classes"] == load_manifest(dataset_dir(tmp_path / "data", "x")).classes
    assert 0.0 <= result["test_accuracy"] <= 1.0
    assert "crops, flips and colour distortions are off" in captured.err  # the echo says so


@pytest.fixture()
def repo(tmp_path):
    """A fresh git + DVC project holding the real dvc.yaml, params.yaml and data/.gitignore."""
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    for name in ("dvc.yaml", "params.yaml", "data/.gitignore"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        shutil.copy(PROJECT / name, tmp_path / name)
    run_dvc(tmp_path, "init", "-q")
    return tmp_path


@pytest.mark.slow
def test_arrays_are_versioned_by_dvc_like_any_source(repo):
    """params.yaml naming an .npz, and the settings a Python caller gets from `fetch_config`
    (a stage folder of their own): both built by `dvc repro`, `dvc status` clean, the same
    arrays the same version."""
    npz = write_npz(repo / "x.npz", *tabular())
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["fetch"] = {"source": "arrays", "url": "x.npz", "name": "tab"}
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    version = update_dataset(DataStages(repo, repo))
    assert load_manifest(dataset_dir(repo / "data", "tab")).dtype == "float32"
    assert "up to date" in run_dvc(repo, "status").stdout
    assert update_dataset(DataStages(repo, repo)) == version

    train, test = tokens()
    saved = save_arrays(train, test, repo / "data", "tok")
    stages = data_stages(repo, fetch_config(saved, "tok"), PreprocessConfig(), repo / "data")
    assert stages.folder == repo / "datasets" / "tok"
    tok_version = update_dataset(stages)
    assert (repo / "data" / "raw" / "tok" / "tok.npz").read_bytes() == saved.read_bytes()
    assert load_manifest(dataset_dir(repo / "data", "tok")).features == Features((30,), "int32")
    assert "up to date" in run_dvc(repo, "status").stdout
    # The same arrays again: the same file, the same settings, nothing rebuilt.
    again = save_arrays(train, test, repo / "data", "tok")
    assert (
        data_stages(repo, fetch_config(again, "tok"), PreprocessConfig(), repo / "data") == stages
    )
    assert update_dataset(stages) == tok_version
    assert npz.is_file()
