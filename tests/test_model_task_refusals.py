"""Refused in one line before training (issue 61 item 3): an activated output (softmax, sigmoid)
under a loss taken from logits, and a model compiled with another loss than train.loss (which
would be silently ignored); the same output under a loss that takes it as it is trains."""

from __future__ import annotations

import textwrap

import fixtures_model
import pytest

from towerbench.cli.main import main
from towerbench.core.errors import TowerbenchError
from towerbench.model.user_model import build_user_model

MODEL = """
import keras

def build(input_shape, width):
    inputs = keras.Input(shape=input_shape)
    x = keras.layers.Flatten()(inputs)
    model = keras.Model(inputs, keras.layers.Dense(width, activation={activation!r}, name="out")(x))
    {compile}
    return model
"""


def _model(tmp_path, activation=None, compile_with=None) -> str:
    compile_line = "" if compile_with is None else f"model.compile(loss={compile_with})"
    path = tmp_path / "net.py"
    path.write_text(textwrap.dedent(MODEL.format(activation=activation, compile=compile_line)))
    return f"{path}:build"


REFUSED = [
    (
        "sigmoid",
        None,
        "binary_crossentropy",
        "its last layer 'out' applies sigmoid; return logits (Dense(num_classes) with no "
        "activation): binary_crossentropy applies it from logits",
    ),
    ("sigmoid", None, "sparse_categorical_crossentropy", "its last layer 'out' applies sigmoid"),
    ("softmax", None, "categorical_crossentropy", "its last layer 'out' applies softmax"),
    (
        None,
        "'mse'",
        "sparse_categorical_crossentropy",
        "the model is compiled with loss 'mse', "
        "train.loss is sparse_categorical_crossentropy: towerbench trains train.loss and ignores "
        "the compiled one",
    ),
    (
        None,
        "keras.losses.Huber()",
        "mae",
        "the model is compiled with loss 'huber_loss', train.loss is mae",
    ),
]


@pytest.mark.parametrize(("activation", "compiled", "loss", "message"), REFUSED)
def test_an_output_or_a_compiled_loss_that_disagrees_with_the_loss_is_one_line(
    tmp_path, activation, compiled, loss, message
):
    reference = _model(tmp_path, activation, compiled)
    with pytest.raises(TowerbenchError) as raised:
        build_user_model(reference, (4, 4, 1), 3, loss=loss)
    assert str(raised.value).startswith(f"{reference}: {message}")
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize(
    ("activation", "compiled", "loss"),
    [
        ("sigmoid", None, "mse"),  # targets in [0, 1]: a sigmoid output is the prediction
        (None, "'sparse_categorical_crossentropy'", "sparse_categorical_crossentropy"),
        (None, "keras.losses.MeanSquaredError()", "mse"),
        (None, "'mae'", "mae"),
    ],
)
def test_an_output_or_a_compiled_loss_that_agrees_is_built(tmp_path, activation, compiled, loss):
    model = build_user_model(_model(tmp_path, activation, compiled), (4, 4, 1), 3, loss=loss)
    assert tuple(model.outputs[0].shape) == (None, 3)


@pytest.mark.slow
def test_train_refuses_a_compiled_loss_with_exit_2_before_training(tmp_path, capfd):
    data_dir = fixtures_model.write_digits(tmp_path / "data", train=64, test=32)
    reference = _model(tmp_path, None, "'categorical_crossentropy'")
    status = main(
        ["train", "--model", reference, "--data-dir", str(data_dir), "--epochs", "1"]
        + ["--global-batch", "32", "--crop-size", "none"]
    )
    err = capfd.readouterr().err
    assert status == 2, err[-2000:]
    line = [text for text in err.splitlines() if "compiled with loss" in text]
    assert len(line) == 1 and "'categorical_crossentropy', train.loss is " in line[0]
    assert "Traceback" not in err


COMPILED_WITH_OWN = """
import keras

def my_loss(y_true, y_pred):
    return keras.losses.sparse_categorical_crossentropy(y_true, y_pred, from_logits=True)

def other_loss(y_true, y_pred):
    return 2.0 * my_loss(y_true, y_pred)

def build(input_shape, width):
    inputs = keras.Input(shape=input_shape)
    model = keras.Model(inputs, keras.layers.Dense(width)(keras.layers.Flatten()(inputs)))
    model.compile(loss=my_loss)
    return model
"""


def test_a_model_compiled_with_your_loss_is_taken_and_with_another_refused(tmp_path):
    path = tmp_path / "net.py"
    path.write_text(textwrap.dedent(COMPILED_WITH_OWN))
    build_user_model(f"{path}:build", (4, 4, 1), 3, loss=f"{path}:my_loss")
    with pytest.raises(TowerbenchError) as raised:
        build_user_model(f"{path}:build", (4, 4, 1), 3, loss=f"{path}:other_loss")
    assert f"the model is compiled with loss 'my_loss', train.loss is {path}:other_loss" in str(
        raised.value
    )


def test_keras_loss_objects_are_refused_and_partials_carried_by_value(tmp_path):
    import functools

    import keras

    from towerbench.api.notebook_model import LOSS, function_file

    with pytest.raises(TowerbenchError, match=r"^loss=: Huber\(\) is a Keras Loss object"):
        function_file(keras.losses.Huber(), tmp_path, LOSS)
    written = function_file(functools.partial(keras.losses.huber, delta=2.0), tmp_path, LOSS)
    assert written.startswith(str(tmp_path.resolve() / "models" / "loss-"))
    assert written.endswith(".py:loss")
