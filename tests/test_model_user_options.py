"""bench, mixed precision and XLA with your own model: `bench --model` sets our step against Keras
fit + MirroredStrategy on it; its layers compute in 16 bits under the towers' dtype policy, its
logits are cast to float32 for the loss, and what cannot honour a precision is refused in one
line."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import fixtures_model
import keras
import numpy as np
import pytest

from towerbench.cli.main import main
from towerbench.config.sections import TrainConfig
from towerbench.core.errors import TowerbenchError
from towerbench.model import training
from towerbench.model.networks import build_network

# A user's network: convolution, BatchNorm, dropout and a regularized Dense layer named so the
# test can find it.
USER_MODEL = """
import keras

def build(input_shape, num_classes):
    inputs = keras.Input(shape=input_shape)
    x = keras.layers.Conv2D(8, 3, padding="same", use_bias=False)(inputs)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.ReLU()(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    x = keras.layers.Dropout(0.2)(x)
    x = keras.layers.Dense(16, activation="relu", name="hidden",
                           kernel_regularizer=keras.regularizers.L2(1e-4))(x)
    return keras.Model(inputs, keras.layers.Dense(num_classes, name="logits")(x))
"""


ROOT = Path(__file__).resolve().parents[1]


def _model_file(folder: Path, source: str) -> str:
    path = folder / "net.py"
    path.write_text(textwrap.dedent(source))
    return f"{path}:build"


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return fixtures_model.write_digits(tmp_path_factory.mktemp("data"), train=128, test=32)


def _train(tmp_path: Path, data_dir: Path, **options) -> training.TrainResult:
    config = TrainConfig(
        model=_model_file(tmp_path, USER_MODEL),
        dataset="digits",
        towers=2,
        global_batch=32,
        epochs=1,
        **options,
    )
    return training.train(config, data_dir)


@pytest.fixture(scope="module")
def float32_run(tmp_path_factory, data_dir) -> training.TrainResult:
    """The same training in float32 without XLA: what the other precisions are measured against."""
    return _train(tmp_path_factory.mktemp("float32"), data_dir)


def _largest_weight_difference(result: training.TrainResult, reference: training.TrainResult):
    return max(
        float(np.max(np.abs(weights - reference_weights)))
        for weights, reference_weights in zip(
            result.model.get_weights(), reference.model.get_weights(), strict=True
        )
    )


@pytest.mark.slow
def test_a_user_model_trains_in_bfloat16_on_two_towers(tmp_path, data_dir, float32_run):
    result = _train(tmp_path, data_dir, precision="mixed_bfloat16")
    hidden = result.model.get_layer("hidden")
    assert hidden.compute_dtype == "bfloat16" and hidden.output.dtype == "bfloat16"
    assert {variable.dtype for variable in result.model.trainable_variables} == {"float32"}
    assert result.model.outputs[0].dtype == "float32"  # the loss sees float32 logits
    assert keras.config.dtype_policy().name == "float32"  # restored after the build
    # The same steps in 16 bits: the loss within bfloat16's precision of float32's, the weights
    # moved as float32's did (a loss or update computed wrongly in 16 bits is far off both).
    reference = float32_run.history[-1].total_loss
    assert result.history[-1].total_loss == pytest.approx(reference, rel=0.02)
    assert _largest_weight_difference(result, float32_run) < 0.02


@pytest.mark.slow
def test_a_user_model_trains_with_xla_as_without(tmp_path, data_dir, float32_run):
    result = _train(tmp_path, data_dir, xla=True)
    # XLA draws its own dropout masks, so the runs differ a little, never by a wrong step.
    reference = float32_run.history[-1].total_loss
    assert result.history[-1].total_loss == pytest.approx(reference, rel=0.02)
    assert _largest_weight_difference(result, float32_run) < 0.02


# --- what cannot honour a precision --------------------------------------------------------------

FLOAT16_WEIGHTS = """
import keras
def build(input_shape, num_classes):
    inputs = keras.Input(shape=input_shape)
    x = keras.layers.Dense(8, name="half")(keras.layers.Flatten()(inputs))
    return keras.Model(inputs, keras.layers.Dense(num_classes, dtype="float16", name="out")(x))
"""
EVERY_LAYER_FLOAT32 = """
import keras
def build(input_shape, num_classes):
    inputs = keras.Input(shape=input_shape)
    x = keras.layers.Flatten(dtype="float32")(inputs)
    return keras.Model(inputs, keras.layers.Dense(num_classes, dtype="float32")(x))
"""
FLOAT16_WITHOUT_LOSS_SCALE = """
import keras
def build(input_shape, num_classes):
    keras.config.set_dtype_policy("mixed_float16")  # left set: towerbench restores its own
    inputs = keras.Input(shape=input_shape)
    x = keras.layers.Dense(num_classes, name="fast")(keras.layers.Flatten()(inputs))
    return keras.Model(inputs, x)
"""
REFUSED = {
    "float16 weights": (
        FLOAT16_WEIGHTS,
        "mixed_float16",
        r"layer 'out' keeps its weights in float16; towers keep float32 weights .*: remove its "
        r"dtype= argument$",
    ),
    "no layer in bfloat16": (
        EVERY_LAYER_FLOAT32,
        "mixed_bfloat16",
        r"precision mixed_bfloat16: no layer with weights computes in bfloat16",
    ),
    "float16 without its loss scale": (
        FLOAT16_WITHOUT_LOSS_SCALE,
        "float32",
        r"layer 'fast' computes in float16 under precision float32, which scales no loss",
    ),
}


@pytest.mark.parametrize("case", REFUSED)
def test_a_model_that_cannot_honour_the_precision_is_refused_in_one_line(tmp_path, case):
    source, precision, expected = REFUSED[case]
    reference = _model_file(tmp_path, source)
    with pytest.raises(TowerbenchError) as error:
        build_network(reference, (8, 8, 1), 10, seed=0, precision=precision)
    message = str(error.value)
    assert "\n" not in message and message.startswith(f"{reference}: ")
    assert re.search(expected, message), message
    assert keras.config.dtype_policy().name == "float32"


def test_16_bit_logits_of_a_user_model_are_cast_to_float32(tmp_path):
    source = USER_MODEL.replace('name="logits"', 'name="logits", dtype="mixed_bfloat16"')
    network = build_network(_model_file(tmp_path, source), (8, 8, 1), 10, seed=0)
    assert network.model.get_layer("logits").compute_dtype == "bfloat16"
    assert network.model.outputs[0].dtype == "float32"


# --- bench ---------------------------------------------------------------------------------------


@pytest.mark.slow  # a TensorFlow process: ~11 s on 2 cores
def test_bench_sets_our_step_against_keras_on_a_user_model(tmp_path):
    reference = _model_file(tmp_path, USER_MODEL)
    tiny = ["--image-shape", "8,8,1", "--quick", "--max-seconds", "0"]
    options = ["--model", reference, "--towers", "2", "--global-batch", "64", *tiny]
    options += ["--optimizer", "adam"]  # both sides time the configured optimizer
    completed = subprocess.run(
        [sys.executable, "-m", "towerbench.cli.main", "bench", *options, "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    summary = json.loads(completed.stdout)
    assert summary["model_function"] == "net:build"
    assert (summary["image_shape"], summary["global_batch"]) == ([8, 8, 1], 64)
    measured = {(step["runner"], step["towers"]): step for step in summary["steps"]}
    assert set(measured) == {(side, k) for side in ("towerbench", "keras_mirrored") for k in (1, 2)}
    assert all(
        step["step_seconds"] > 0 and step["global_batch"] == 64 for step in measured.values()
    )
    assert set(summary["vs_keras_mirrored"]) == {"1", "2"}
    assert all(figure["ratio"] > 0 for figure in summary["vs_keras_mirrored"].values())
    assert "Keras fit + MirroredStrategy, `net:build`, 2 tower(s)" in completed.stderr
    assert summary["optimizer"] == "adam (beta_1 0.9, beta_2 0.999, epsilon 1e-07)"


def test_bench_refuses_a_user_model_in_one_line_before_timing_it(tmp_path, capsys):
    reference = _model_file(tmp_path, FLOAT16_WEIGHTS)
    status = main(["bench", "--model", reference, "--image-shape", "8,8,1", "--quick"])
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert status == 2
    assert error.startswith(f"towerbench bench: error: {reference}: layer 'out' keeps its weights")


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        (["--towers", "2"], "--towers 2: the benchmark of the built-in networks is fixed"),
        (["--model", "resnet20"], "--model resnet20: the benchmark of the built-in networks"),
        (["--model", "net.py:build", "--image-shape", "8,8"], "--image-shape 8,8: give height"),
    ],
)
def test_bench_refuses_options_that_do_not_fit_its_network(tmp_path, capsys, options, expected):
    _model_file(tmp_path, USER_MODEL)
    options = [f"{tmp_path}/{o}" if o == "net.py:build" else o for o in options]
    assert main(["bench", *options]) == 2
    assert expected in capsys.readouterr().err
