"""Your own per-example loss (issue 61 item 1): `train.loss: file.py:function` beside the params
file, `package.module:function`, or a function from Python (`loss=`), called as Keras' losses are
(`fn(y_true, y_pred) -> (batch,)`), trains as the same loss built in does, is refused in one line
when it returns a mean or raises, and is named in MLflow by its file's sha256."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import fixtures_model
import fixtures_user
import numpy as np
import pytest

from towerbench.cli.main import main
from towerbench.config.sections import TrainConfig
from towerbench.core.errors import TowerbenchError
from towerbench.model import training
from towerbench.model.losses import per_example_loss

LOSSES = """
import keras
from keras import ops

def squared(y_true, y_pred):
    return ops.mean(ops.square(y_pred - y_true), axis=-1)

def cross_entropy(y_true, y_pred):
    return keras.losses.sparse_categorical_crossentropy(y_true, y_pred, from_logits=True)

def doubled(y_true, y_pred):
    return 2.0 * cross_entropy(y_true, y_pred)

def mean_only(y_true, y_pred):
    return ops.mean(keras.losses.sparse_categorical_crossentropy(y_true, y_pred, from_logits=True))

def broken(y_true, y_pred):
    raise ValueError("labels and predictions disagree")
"""


@pytest.fixture()
def loss_file(tmp_path):
    path = tmp_path / "my_losses.py"
    path.write_text(LOSSES)
    return path


def test_a_users_loss_is_the_built_in_one_to_1e_5(loss_file):
    rng = np.random.default_rng(0)
    outputs = rng.standard_normal((16, 3)).astype(np.float32)
    targets = rng.standard_normal((16, 3)).astype(np.float32)
    ids = rng.integers(0, 3, 16).astype(np.int32)
    np.testing.assert_allclose(
        per_example_loss(f"{loss_file}:squared")(targets, outputs),
        per_example_loss("mse")(targets, outputs),
        rtol=1e-5,
    )
    np.testing.assert_allclose(
        per_example_loss(f"{loss_file}:cross_entropy")(ids, outputs),
        per_example_loss("sparse_categorical_crossentropy")(ids, outputs),
        rtol=1e-5,
    )


@pytest.mark.parametrize(
    ("function", "message"),
    [
        (
            "mean_only",
            "mean_only(y_true, y_pred) returned shape () for a batch of 4: a "
            "per-example loss returns one value per example (batch,), not their mean",
        ),
        ("broken", "broken(y_true, y_pred) raised ValueError: labels and predictions disagree"),
        ("missing", "no function 'missing' in"),
    ],
)
def test_a_loss_that_returns_a_mean_raises_or_is_missing_is_one_line(loss_file, function, message):
    reference = f"{loss_file}:{function}"
    with pytest.raises(TowerbenchError) as raised:
        per_example_loss(reference)(np.zeros(4, np.int32), np.zeros((4, 3), np.float32))
    assert str(raised.value).startswith(f"{reference}: ") and message in str(raised.value)
    assert "\n" not in str(raised.value)


def test_a_loss_that_is_no_function_reference_or_a_missing_file_is_refused(tmp_path, capsys):
    for loss, message in (
        ("cross_entropy", "--loss: 'cross_entropy' is not a built-in loss"),
        ("nowhere.py:loss", "--loss: nowhere.py: no such loss file (looked for "),
    ):
        status = main(["gradcheck", "--loss", loss, "--data-dir", str(tmp_path)])
        err = capsys.readouterr().err
        assert status == 2 and message in err and err.count("\n") == 1, err


@pytest.mark.slow
def test_training_with_a_users_cross_entropy_equals_the_built_in(tmp_path, loss_file):
    data_dir = fixtures_model.write_digits(tmp_path, train=256, test=64)
    common = {"towers": 2, "global_batch": 64, "epochs": 1, "crop_size": None}
    built_in = training.train(TrainConfig(**common), data_dir)
    users = training.train(TrainConfig(loss=f"{loss_file}:cross_entropy", **common), data_dir)
    for mine, theirs in zip(users.history, built_in.history, strict=True):
        assert mine.cross_entropy == pytest.approx(theirs.cross_entropy, rel=1e-5)
        assert mine.test_cross_entropy == pytest.approx(theirs.test_cross_entropy, rel=1e-5)
        assert mine.train_accuracy == theirs.train_accuracy
    np.testing.assert_array_equal(users.confusion_matrix, built_in.confusion_matrix)
    # The loss trained is the file's: twice the cross-entropy is recorded as about twice.
    doubled = training.train(TrainConfig(loss=f"{loss_file}:doubled", **common), data_dir)
    assert doubled.history[0].cross_entropy > 1.5 * built_in.history[0].cross_entropy


@pytest.mark.slow
def test_a_loss_file_beside_the_params_file_is_found_from_anywhere(tmp_path, capfd, monkeypatch):
    project = tmp_path / "project"
    params = fixtures_model.write_digits_project(
        project,
        "train:\n  loss: my_losses.py:cross_entropy\n  epochs: 1\n  global_batch: 32\n"
        "  crop_size: null\n",
        train=128,
        test=64,
    )
    (project / "my_losses.py").write_text(LOSSES)
    monkeypatch.chdir(tmp_path)  # not the params file's folder
    status = main(["train", "--params", str(params), "--towers", "2", "--json"])
    captured = capfd.readouterr()
    assert status == 0, captured.err[-3000:]
    result = json.loads(captured.out.strip().splitlines()[-1])
    assert result["config"]["loss"] == f"{project / 'my_losses.py'}:cross_entropy"
    assert result["status"] == "completed" and 0 <= result["test_accuracy"] <= 1


SCRIPT = """
import json
from pathlib import Path
import keras
import numpy as np
import towerbench

def build(input_shape, num_classes):
    inputs = keras.Input(input_shape)
    return keras.Model(inputs, keras.layers.Dense(num_classes)(inputs))

def my_loss(y_true, y_pred):
    return keras.losses.sparse_categorical_crossentropy(y_true, y_pred, from_logits=True)

rng = np.random.default_rng(0)
labels = rng.integers(0, 3, size=200)
features = (np.eye(3)[labels] + 0.3 * rng.normal(size=(200, 3))).astype(np.float32)
data = ((features[:160], labels[:160]), (features[160:], labels[160:]))
common = dict(model=build, data=data, name="blobs", epochs=1, global_batch=32)
try:
    towerbench.train(loss=lambda y: y, **common)
except towerbench.TowerbenchError as error:
    print("REFUSED", error)
mine = towerbench.train(loss=my_loss, tracking_uri="sqlite:///mine.db", **common)
built_in = towerbench.train(tracking_uri="sqlite:///built_in.db", **common)
print(json.dumps([mine.model_dump(mode="json"), built_in.model_dump(mode="json")]))
"""


@pytest.mark.slow
def test_a_loss_function_from_python_trains_as_the_built_in_one(tmp_path):
    done = fixtures_user.run_script(tmp_path, SCRIPT, timeout=600)
    lines = done.stdout.strip().splitlines()
    assert "REFUSED loss=: '<lambda>' takes (y), not loss(y_true, y_pred)" in lines
    mine, built_in = json.loads(lines[-1])
    assert mine["test_accuracy"] == built_in["test_accuracy"]
    assert (mine["metric"], mine["test_metric"]) == ("accuracy", mine["test_accuracy"])
    assert mine["train_cross_entropy"] == pytest.approx(built_in["train_cross_entropy"], rel=1e-5)
    (written,) = (tmp_path / "data" / "models").glob("loss-*.py")
    import mlflow

    run = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mine.db'}").get_run(mine["run_id"])
    assert run.data.params["loss"] == f"{written}:loss"
    assert run.data.params["loss_function"] == "loss"
    assert run.data.params["loss_digest"] == hashlib.sha256(written.read_bytes()).hexdigest()


def test_a_swept_list_of_loss_files_is_taken_beside_the_params_file(tmp_path, monkeypatch):
    from towerbench.config.load import load

    project = tmp_path / "project"
    project.mkdir()
    (project / "my_losses.py").write_text(LOSSES)
    (project / "params.yaml").write_text(
        "sweep:\n  grid:\n    loss: [my_losses.py:cross_entropy, sparse_categorical_crossentropy]\n"
    )
    monkeypatch.chdir(tmp_path)
    params = load(project / "params.yaml", [], resolve_tracking=False)
    assert params.sweep.grid.loss == [
        f"{project / 'my_losses.py'}:cross_entropy",
        "sparse_categorical_crossentropy",
    ]


def test_the_probe_judges_a_regression_loss_by_nan_only():
    from towerbench.model.probe import divergence

    climbing = [float(step) for step in range(1, 40)]
    assert divergence(climbing, 1, "mse") is None  # no chance level to rise above
    assert divergence([*climbing, float("nan")], 1, "mse").startswith("the training loss was not")
    assert divergence([50.0] * 39, 10) is not None  # far above ln 10


def test_a_swept_list_holding_a_python_loss_writes_its_file(tmp_path):
    from towerbench.api.inputs import function_overrides, given_functions, train_overrides

    cell: dict = {}  # a function defined in a notebook cell: no file to import it from
    exec(
        "import keras\n\ndef mine(y_true, y_pred):\n"
        "    return keras.ops.mean(keras.ops.square(y_pred - y_true), axis=-1)\n",
        cell,
    )
    overrides = train_overrides({"loss": [cell["mine"], "mse"]}, lists_to_grid=True)
    assert given_functions(overrides) == overrides
    (written,) = function_overrides(overrides, tmp_path)
    reference, built_in = written.value
    path, _ = reference.rsplit(":", 1)
    assert built_in == "mse" and Path(path).parent == tmp_path / "models"
