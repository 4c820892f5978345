"""Your own model: `--model file.py:function`, every bad input refused in one line, and towers that
treat its BatchNorm, dropout and regularizers as one device on the whole batch would."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import fixtures_model
import keras
import numpy as np
import pytest
import tensorflow as tf

from towerbench.cli.main import main
from towerbench.config.load import Override, load
from towerbench.config.model_ref import parse_model
from towerbench.config.sections import TrainConfig
from towerbench.core.errors import TowerbenchError
from towerbench.model.devices import configure_tower_devices
from towerbench.model.gradcheck import run_gradcheck
from towerbench.model.networks import build_network
from towerbench.model.towers import TowerTrainer
from towerbench.model.user_model import build_user_model

# A small network as a user would write it: BatchNorm, dropout, kernel and activity regularizers.
USER_MODEL = """
import keras

def build(input_shape, num_classes):
    inputs = keras.Input(shape=input_shape)
    x = keras.layers.Conv2D(8, 3, padding="same", use_bias=False,
                            kernel_regularizer=keras.regularizers.L2(1e-3))(inputs)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.ReLU()(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    x = keras.layers.Dropout(0.3)(x)
    return keras.Model(inputs, keras.layers.Dense(num_classes)(x))
"""


def _model_file(folder: Path, source: str, name: str = "net.py") -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(source))
    return path


# --- the option: parsing and paths, without TensorFlow -------------------------------------------


def test_model_references_parse_into_builtin_file_and_module_forms():
    assert parse_model("tutorial_bn").builtin
    assert parse_model("nets/small.py:build").path == Path("nets/small.py")
    reference = parse_model("mypackage.nets:build_net")
    assert (reference.module, reference.function, reference.label) == (
        "mypackage.nets",
        "build_net",
        "mypackage.nets:build_net",
    )
    assert parse_model("/home/me/nets/small.py:build").label == "small:build"
    with pytest.raises(ValueError, match="not a built-in network"):
        parse_model("resnet50")
    with pytest.raises(ValueError, match="not a function name"):
        parse_model("net.py:2fast")


def test_a_model_file_is_found_next_to_the_params_file_and_a_missing_one_named(tmp_path):
    (tmp_path / "nets").mkdir()
    _model_file(tmp_path / "nets", USER_MODEL)
    params = tmp_path / "params.yaml"
    params.write_text("train:\n  model: nets/net.py:build\n")
    assert load(params, resolve_tracking=False).train.model == f"{tmp_path}/nets/net.py:build"
    params.write_text("train:\n  model: nets/other.py:build\n")
    with pytest.raises(TowerbenchError) as error:
        load(params, resolve_tracking=False)
    assert str(error.value) == (
        f"{params}: train.model: nets/other.py: no such model file "
        f"(looked for {tmp_path}/nets/other.py)"
    )
    given = Override(TrainConfig, "model", "gone.py:build", "--model")
    with pytest.raises(TowerbenchError, match=r"^--model: gone.py: no such model file"):
        load(None, [given], resolve_tracking=False)


def test_a_missing_model_file_exits_with_status_2_before_tensorflow_trains(tmp_path, capsys):
    status = main(["train", "--model", str(tmp_path / "gone.py") + ":build", "--epochs", "1"])
    assert status == 2
    assert "gone.py: no such model file" in capsys.readouterr().err


# --- every bad input: one line -------------------------------------------------------------------

BAD_MODELS = {
    "no function": (
        "def other(input_shape, num_classes):\n    pass\n",
        r"no function 'build' in .*net\.py \(its functions: other\)$",
    ),
    "import raises": (
        "import keras\n\nraise RuntimeError('no GPU here')\n",
        r"importing .*net\.py raised RuntimeError: no GPU here \(.*net\.py:3\)$",
    ),
    "syntax error": (
        "def build(:\n",
        r"importing .*net\.py raised SyntaxError: .* \(.*net\.py:1\)$",
    ),
    "function raises": (
        "def build(input_shape, num_classes):\n    x = 1\n    raise ValueError('bad width')\n",
        r"build\(\(8, 8, 1\), 10\) raised ValueError: bad width \(.*net\.py:3\)$",
    ),
    "not a model": (
        "def build(input_shape, num_classes):\n    return 'model'\n",
        r"build returned str, not a tf.keras.Model$",
    ),
    "wrong output shape": (
        """
        import keras
        def build(input_shape, num_classes):
            inputs = keras.Input(shape=input_shape)
            x = keras.layers.Flatten()(inputs)
            return keras.Model(inputs, keras.layers.Dense(num_classes + 1)(x))
        """,
        r"the output's shape is \(batch, 11\), not \(batch, 10\): end with "
        r"keras.layers.Dense\(num_classes\)$",
    ),
    "final softmax": (
        """
        import keras
        def build(input_shape, num_classes):
            inputs = keras.Input(shape=input_shape)
            x = keras.layers.Flatten()(inputs)
            out = keras.layers.Dense(num_classes, activation="softmax", name="probs")(x)
            return keras.Model(inputs, out)
        """,
        r"its last layer 'probs' applies softmax; return logits \(Dense\(num_classes\) with no "
        r"activation\)",
    ),
    "softmax in a lambda": (
        """
        import keras
        def build(input_shape, num_classes):
            inputs = keras.Input(shape=input_shape)
            x = keras.layers.Dense(num_classes)(keras.layers.Flatten()(inputs))
            return keras.Model(inputs, keras.layers.Lambda(keras.ops.softmax)(x))
        """,
        r"its outputs are non-negative and sum to 1 \(a softmax\); return logits",
    ),
    "no trainable weights": (
        """
        import keras
        def build(input_shape, num_classes):
            inputs = keras.Input(shape=input_shape)
            x = keras.layers.Flatten()(inputs)
            return keras.Model(inputs, keras.layers.Lambda(lambda t: t[:, :num_classes])(x))
        """,
        r"the model has no trainable weights$",
    ),
    "input shape": (
        """
        import keras
        def build(input_shape, num_classes):
            inputs = keras.Input(shape=(28, 28, 1))
            x = keras.layers.Flatten()(inputs)
            return keras.Model(inputs, keras.layers.Dense(num_classes)(x))
        """,
        r"the model was built for inputs of shape \(28, 28, 1\), the data feeds \(8, 8, 1\)",
    ),
    "two outputs": (
        """
        import keras
        def build(input_shape, num_classes):
            inputs = keras.Input(shape=input_shape)
            x = keras.layers.Flatten()(inputs)
            return keras.Model(inputs, [keras.layers.Dense(num_classes)(x), x])
        """,
        r"the model has 1 inputs and 2 outputs; towers train one image input and one output",
    ),
    "stateful rnn": (
        """
        import keras
        def build(input_shape, num_classes):
            inputs = keras.Input(shape=input_shape, batch_size=2)
            x = keras.layers.Reshape((input_shape[0], -1))(inputs)
            x = keras.layers.SimpleRNN(4, stateful=True, name="memory")(x)
            return keras.Model(inputs, keras.layers.Dense(num_classes)(x))
        """,
        r"layer 'memory' is a stateful RNN",
    ),
    "state updated in training": (
        """
        import keras
        class Counter(keras.layers.Layer):
            def build(self, shape):
                self.seen = self.add_weight(shape=(), initializer="zeros", trainable=False)
            def call(self, x, training=False):
                if training:
                    self.seen.assign(self.seen + 1.0)
                return x
        def build(input_shape, num_classes):
            inputs = keras.Input(shape=input_shape)
            x = Counter(name="counter")(keras.layers.Flatten()(inputs))
            return keras.Model(inputs, keras.layers.Dense(num_classes)(x))
        """,
        r"layer 'counter' updates its variable 'variable' in training",
    ),
}


@pytest.mark.parametrize("case", BAD_MODELS)
def test_each_bad_model_is_refused_in_one_line_naming_the_file(tmp_path, case):
    source, expected = BAD_MODELS[case]
    path = _model_file(tmp_path, source)
    with pytest.raises(TowerbenchError) as error:
        build_user_model(f"{path}:build", (8, 8, 1), 10)
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(f"{path}:build: ")
    assert __import__("re").search(expected, message), message


def test_a_module_reference_builds_from_an_importable_module(tmp_path, monkeypatch):
    package = tmp_path / "mynets"
    package.mkdir()
    (package / "__init__.py").write_text("")
    _model_file(package, USER_MODEL, "small.py")
    monkeypatch.syspath_prepend(str(tmp_path))
    model = build_user_model("mynets.small:build", (8, 8, 1), 10)
    assert model.output_shape == (None, 10)
    assert len(parse_model("mynets.small:build").digest()) == 64


# --- towers with a model we did not write --------------------------------------------------------

REGULARIZED = """
import keras

def build(input_shape, num_classes):
    inputs = keras.Input(shape=input_shape)
    x = keras.layers.Flatten()(inputs)
    x = keras.layers.Dense(16, activation="tanh", kernel_regularizer=keras.regularizers.L2(0.01),
                           activity_regularizer=keras.regularizers.L2(0.02), name="hidden")(x)
    return keras.Model(inputs, keras.layers.Dense(num_classes, name="logits")(x))
"""


def _batch(size: int = 8):
    images = tf.random.stateless_normal((size, 8, 8, 1), seed=[0, 1])
    labels = tf.random.stateless_uniform((size,), [0, 2], 0, 10, tf.int32)
    return images, labels


def _user_trainer(path: Path, towers: int, lr: float = 0.5):
    devices = configure_tower_devices(towers)
    keras.utils.set_random_seed(0)
    with tf.device(devices.parameter_device):
        network = build_network(f"{path}:build", (8, 8, 1), 10, seed=0)
    return network, TowerTrainer(network, keras.optimizers.SGD(lr), devices, "mean", 0.0)


@pytest.mark.slow
def test_the_models_regularizers_enter_once_per_step_not_once_per_tower(tmp_path):
    path = _model_file(tmp_path, REGULARIZED)
    images, labels = _batch()
    after, reported = [], []
    for towers in (1, 2):
        network, trainer = _user_trainer(path, towers)
        start = [v.numpy() for v in network.model.trainable_variables]
        trainer.step(images, labels)
        after.append([v.numpy() for v in network.model.trainable_variables])
        reported.append(float(trainer.metrics.weight_decay_loss.numpy()))
    # By hand, at the starting weights: 0.01 * sum(w**2) of the hidden kernel, and the activity
    # term 0.02 * sum(h**2) / batch over the whole batch (Keras divides by the batch).
    model = network.model
    model.set_weights(start)
    hidden = keras.Model(model.inputs, model.get_layer("hidden").output)(images).numpy()
    kernel = model.get_layer("hidden").kernel.numpy().astype(np.float64)
    expected = 0.01 * np.sum(kernel**2) + 0.02 * np.sum(hidden.astype(np.float64) ** 2) / 8
    assert reported[0] == pytest.approx(expected, rel=1e-5)
    assert reported[1] == pytest.approx(expected, rel=1e-5)  # not 2 x
    # One step with 2 towers is one device's step: the regularizers' gradients entered once.
    for one, two in zip(*after, strict=True):
        np.testing.assert_allclose(two, one, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_dropout_draws_its_own_mask_on_each_tower(tmp_path):
    path = _model_file(
        tmp_path,
        """
        import keras
        def build(input_shape, num_classes):
            inputs = keras.Input(shape=input_shape)
            x = keras.layers.Dropout(0.5)(keras.layers.Flatten()(inputs))
            return keras.Model(inputs, keras.layers.Dense(num_classes)(x))
        """,
    )
    images, labels = _batch(4)
    twice = tf.concat([images, images], 0), tf.concat([labels, labels], 0)
    network, trainer = _user_trainer(path, 2)
    state = network.model.non_trainable_variables[0]
    start = state.numpy()
    combined = trainer.gradients(*twice)
    # Equal shards: equal masks would give equal tower gradients, |g_t|^2 mean = |mean g_t|^2.
    assert float(combined.small_norm_sq) > 1.05 * float(combined.big_norm_sq)
    trainer.step(*twice)
    np.testing.assert_array_equal(state.numpy(), start + [0, 1])  # advanced as one tower's


@pytest.mark.slow
def test_batchnorm_moving_statistics_end_as_the_mean_of_the_towers_updates(tmp_path):
    path = _model_file(tmp_path, USER_MODEL)
    images, labels = _batch()
    images = images * tf.reshape(tf.range(1.0, 9.0), (8, 1, 1, 1))  # shards of different scale
    network, trainer = _user_trainer(path, 2)
    batchnorm = next(
        layer
        for layer in network.model.layers
        if isinstance(layer, keras.layers.BatchNormalization)
    )
    old_variance = batchnorm.moving_variance.numpy()
    conv = network.model.layers[1]
    features = [conv(shard).numpy() for shard in tf.split(images, 2)]  # at the step's weights
    trainer.step(images, labels)
    # By hand: each tower's update momentum * old + (1 - momentum) * its shard's variance
    # (Keras uses the biased variance), then their mean.
    updates = [
        batchnorm.momentum * old_variance + (1 - batchnorm.momentum) * f.var(axis=(0, 1, 2))
        for f in features
    ]
    np.testing.assert_allclose(
        batchnorm.moving_variance.numpy(), np.mean(updates, 0), rtol=1e-4, atol=1e-7
    )


@pytest.mark.slow
def test_gradcheck_on_a_users_batchnorm_network_agrees_with_ghost_batchnorm(tmp_path, capsys):
    path = _model_file(tmp_path, USER_MODEL)
    data_dir = fixtures_model.write_digits(tmp_path / "data", train=64, test=16)
    command = ["gradcheck", "--model", f"{path}:build", "--towers", "2", "--global-batch", "16"]
    assert main([*command, "--seed", "1", "--data-dir", str(data_dir), "--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["images"] == "8x8x1, 10 classes: the shape 'digits' feeds"  # not 32x32x3
    assert result["batchnorm"] and [n[:7] for n in result["dropout_disabled"]] == ["dropout"]
    assert result["ghost_vs_mean"]["max_rel_diff"] <= 1e-5
    assert result["mirrored_vs_mean"]["max_rel_diff"] <= 1e-5
    assert result["mean_vs_single"]["max_rel_diff"] > 1e-3
    assert result["passed"]
    explanation = result["explanation"]
    assert "Only the per-shard comparison is at rounding level" in explanation
    assert "rounding level: what remains" not in explanation


@pytest.mark.slow
def test_gradcheck_names_rounding_where_the_network_has_no_batchnorm(tmp_path):
    path = _model_file(tmp_path, REGULARIZED)
    result = run_gradcheck(f"{path}:build", 2, global_batch=16, seed=1, input_shape=(8, 8, 1))
    assert not result.batchnorm and result.passed
    assert result.mean_vs_single.max_rel_diff <= 1e-5
    assert "That is rounding level" in result.explanation
    assert "BatchNorm normalises" not in result.explanation


@pytest.mark.slow
@pytest.mark.parametrize(("towers", "workers"), [(1, 1), (2, 1), (1, 2)])
def test_train_takes_a_model_file_next_to_the_params_file(tmp_path, capfd, towers, workers):
    params = fixtures_model.write_digits_project(
        tmp_path,
        "train:\n  model: net.py:build\n  epochs: 1\n  global_batch: 32\n",
        train=128,
        test=64,
    )
    _model_file(tmp_path, USER_MODEL)
    options = ["--towers", str(towers), "--workers", str(workers), "--json"]
    status = main(["train", "--params", str(params), *options])
    captured = capfd.readouterr()
    assert status == 0, captured.err[-3000:]
    document = json.loads(captured.out)
    assert document["config"]["model"] == f"{tmp_path}/net.py:build"
    assert (document["config"]["towers"], document["config"]["workers"]) == (towers, workers)
    assert document["status"] == "completed"


@pytest.mark.slow
def test_a_user_model_resumed_from_its_checkpoint_ends_as_an_uninterrupted_run(tmp_path):
    """BatchNorm's moving statistics, the dropout masks' RNG and the optimizer all come back:
    killed after a checkpoint and resumed, it ends with the same weights, bit for bit."""
    from towerbench.model import training

    data_dir = fixtures_model.write_digits(tmp_path / "data", train=300, test=60)
    model = f"{_model_file(tmp_path, USER_MODEL)}:build"
    config = TrainConfig(
        dataset="digits", model=model, towers=2, global_batch=64, epochs=2, checkpoint_every=3
    )
    uninterrupted = training.train(config, data_dir)

    class Killed(Exception):
        pass

    def kill_at_step_7(metrics) -> None:
        if metrics["step"] == 7:
            raise Killed

    steps_after_resume: list[int] = []
    original = training.PROGRESS_SECONDS
    training.PROGRESS_SECONDS = 0.0  # progress after every step
    try:
        with pytest.raises(Killed):
            training.train(config, data_dir, tmp_path / "ckpt", on_progress=kill_at_step_7)
        resumed = training.train(
            config,
            data_dir,
            tmp_path / "ckpt",
            on_progress=lambda metrics: steps_after_resume.append(metrics["step"]),
        )
    finally:
        training.PROGRESS_SECONDS = original
    assert min(steps_after_resume) == 7  # from the checkpoint at step 6, not from the start
    assert resumed.final.steps == uninterrupted.final.steps == 10
    for after_resume, straight in zip(
        resumed.model.get_weights(), uninterrupted.model.get_weights(), strict=True
    ):
        np.testing.assert_array_equal(after_resume, straight)


def test_weight_decay_set_beside_a_user_model_is_refused_in_one_line(tmp_path, capsys):
    path = _model_file(tmp_path, USER_MODEL)
    params = tmp_path / "params.yaml"
    params.write_text(f"train:\n  model: {path.name}:build\n  weight_decay: 0.001\n")
    with pytest.raises(TowerbenchError, match=rf"{params}: train.weight_decay: applies to the b"):
        load(params, resolve_tracking=False)
    params.write_text(f"train:\n  model: {path.name}:build\n  dataset: cifar10\n")
    assert load(params, resolve_tracking=False).train.model.endswith("net.py:build")  # presets
    command = ["train", "--model", f"{path}:build", "--weight-decay", "1e-4"]
    assert main([*command, "--data-dir", str(tmp_path)]) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and "--weight-decay: applies to the built-in" in error
    assert "kernel_regularizer" in error


@pytest.mark.slow
def test_adamw_beside_a_models_regularizers_is_refused_as_double_weight_decay(tmp_path, capsys):
    """adamw decays the weights itself: with a model whose layers add L2 to the loss, the
    weights would decay twice. --weight-decay 0 keeps the model's own and trains."""
    data_dir = fixtures_model.write_digits(tmp_path / "data", train=64, test=16)
    path = _model_file(tmp_path, REGULARIZED)
    command = ["train", "--model", f"{path}:build", "--optimizer", "adamw", "--dataset", "digits"]
    command += ["--global-batch", "16", "--epochs", "1", "--data-dir", str(data_dir)]
    assert main(command) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert error == [
        f"towerbench train: error: {path}:build: --optimizer adamw decays the weights itself "
        "(weight decay 0.004) and the model's regularizers (hidden/kernel) add L2 to the loss: "
        "they would decay twice; set --weight-decay 0 to keep the regularizers, or remove them"
    ]
    assert main([*command, "--weight-decay", "0"]) == 0


def test_the_small_resnet_example_offers_a_network_for_decoupled_weight_decay():
    """examples/small_resnet.py: `build` keeps its L2 regularizers (refused beside adamw's own
    decay), `build_without_l2` is the same network without them (accepted)."""
    from towerbench.model.optimizers import check_weight_decay_once
    from towerbench.model.user_model import load_builder

    example = Path(__file__).parent.parent / "examples" / "small_resnet.py"
    networks = {}
    for function in ("build", "build_without_l2"):
        reference = parse_model(f"{example}:{function}")
        networks[function] = load_builder(reference, function)((32, 32, 3), 10)
    config = TrainConfig(model=f"{example}:build", optimizer="adamw")
    with pytest.raises(TowerbenchError, match="they would decay twice"):
        check_weight_decay_once(networks["build"], config)
    check_weight_decay_once(networks["build_without_l2"], config)
    shapes = {f: [v.shape for v in m.trainable_variables] for f, m in networks.items()}
    assert shapes["build"] == shapes["build_without_l2"]
    assert not networks["build_without_l2"].losses and len(networks["build"].losses) == 7


def test_a_build_that_takes_long_is_said_on_stderr_and_a_quick_one_is_not(
    tmp_path, capfd, monkeypatch
) -> None:
    """An endless `build()` would otherwise hang without a word (Ctrl-C stops it)."""
    from towerbench.model import user_model

    monkeypatch.setattr(user_model, "BUILD_NOTICE_SECONDS", 0.3)
    slow = _model_file(
        tmp_path,
        "import time\n"
        + USER_MODEL.replace(
            "    inputs = keras.Input", "    time.sleep(1.0)\n    inputs = keras.Input"
        ),
        "slow.py",
    )
    build_user_model(f"{slow}:build", (8, 8, 1), 10)
    said = capfd.readouterr().err.splitlines()
    assert said == [
        f"towerbench: {slow}:build: build((8, 8, 1), 10) has been building for 0.3 s (Ctrl-C "
        "stops it)"
    ]
    build_user_model(f"{_model_file(tmp_path, USER_MODEL)}:build", (8, 8, 1), 10)
    assert capfd.readouterr().err == ""
