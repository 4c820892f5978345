"""The optimizers: the square-root rule's hyperparameters, AdamScale's gain, LARS against its
formula, and the configuration's refusals."""

from __future__ import annotations

import fixtures_model  # noqa: F401 - the session's logical devices
import numpy as np
import pytest
import tensorflow as tf
from pydantic import ValidationError

from towerbench.config.optimizers import OPTIMIZERS, adascale_power
from towerbench.config.sections import TrainConfig
from towerbench.model.adascale import AdaScale, AdaScaleSchedule
from towerbench.model.lars import LARS
from towerbench.model.optimizers import build_optimizer
from towerbench.model.schedules import EpochSchedule, StepSchedule, scaled_learning_rate


def test_the_square_root_rule_for_adam_at_four_times_the_batch() -> None:
    """Malladi et al. 2022 at kappa = 4: LR x 2, 1 - beta x 4, epsilon / 2."""
    config = TrainConfig(
        optimizer="adam", base_lr=0.001, global_batch=512, reference_batch=128, lr_scaling="sqrt"
    )
    values = config.optimizer_hyperparameters()
    assert values.beta_1 == pytest.approx(0.6)  # 1 - 4 x 0.1
    assert values.beta_2 == pytest.approx(0.996)  # 1 - 4 x 0.001
    assert values.epsilon == pytest.approx(5e-8)  # 1e-7 / 2
    assert scaled_learning_rate(0.001, 512, 128, "sqrt") == pytest.approx(0.002)


def test_the_square_root_rule_for_rmsprop_scales_rho_and_keeps_beta_at_zero_at_most() -> None:
    rmsprop = TrainConfig(
        optimizer="rmsprop", global_batch=512, reference_batch=128, lr_scaling="sqrt"
    )
    assert rmsprop.optimizer_hyperparameters().rho == pytest.approx(0.6)
    far = TrainConfig(optimizer="adam", global_batch=2048, reference_batch=128, lr_scaling="sqrt")
    assert far.optimizer_hyperparameters().beta_1 == 0.0  # 16 x 0.1 would pass 1: held at 0


@pytest.mark.parametrize("rule", ["none", "linear", "adascale"])
def test_only_the_square_root_rule_moves_the_adaptive_hyperparameters(rule: str) -> None:
    config = TrainConfig(
        optimizer="adam", towers=4, global_batch=512, reference_batch=128, lr_scaling=rule
    )
    values = config.optimizer_hyperparameters()
    assert (values.beta_1, values.beta_2, values.epsilon) == (0.9, 0.999, 1e-7)


def test_sgd_family_hyperparameters_ignore_the_square_root_rule() -> None:
    config = TrainConfig(optimizer="momentum", global_batch=512, lr_scaling="sqrt")
    assert config.optimizer_hyperparameters().items() == {"momentum": 0.9}


def test_weight_decay_is_the_optimizers_for_adamw_lamb_and_lars_only() -> None:
    for name in OPTIMIZERS:
        config = TrainConfig(optimizer=name, weight_decay=0.01)
        decoupled = name in ("adamw", "lamb", "lars")
        assert config.optimizer_hyperparameters().weight_decay == (0.01 if decoupled else None), (
            name
        )
        assert config.l2_weight_decay == (0.0 if decoupled else 0.01), name


def test_adamscale_gain_is_adascales_to_the_power_one_half() -> None:
    """One fixed (small, big) gradient-norm pair at S = 4: the adaptive LR factor is the
    square root of SGD's."""
    adascale = AdaScale(reference_batch=16, global_batch=64, replicas=4, smoothing=0.0)
    adascale.update(tf.constant(3.0), tf.constant(1.0), 64)
    gain = float(adascale.gain.numpy())
    assert gain > 1.5  # the pair carries noise: a gain well above 1
    flat = EpochSchedule(
        base_lr=0.1, peak_lr=0.1, warmup_epochs=0.0, decay="constant", total_epochs=1
    )
    sgd = AdaScaleSchedule(StepSchedule(flat, 10), adascale_power("momentum"), adascale)
    adam = AdaScaleSchedule(StepSchedule(flat, 10), adascale_power("adam"), adascale)
    assert float(sgd(0)) == pytest.approx(0.1 * gain, rel=1e-6)
    assert float(adam(0)) == pytest.approx(0.1 * gain**0.5, rel=1e-6)


def _lars_by_hand(weights, gradients, velocities, lr, momentum, eta, decay, epsilon):
    """You et al.'s Algorithm 1 in numpy, one variable at a time."""
    updated = []
    for index, (w, g) in enumerate(zip(weights, gradients, strict=True)):
        w_norm, g_norm = np.linalg.norm(w), np.linalg.norm(g)
        ratio = eta * w_norm / (g_norm + decay * w_norm + epsilon) if w_norm and g_norm else 1.0
        velocities[index] = momentum * velocities[index] + lr * ratio * (g + decay * w)
        updated.append(w - velocities[index])
    return updated


def test_lars_follows_its_formula_on_a_two_layer_model() -> None:
    rng = np.random.default_rng(0)
    shapes = [(4, 3), (3,), (3, 2), (2,)]  # two dense layers, the biases starting at zero
    weights = [
        rng.standard_normal(shape).astype(np.float32)
        if len(shape) == 2
        else np.zeros(shape, np.float32)
        for shape in shapes
    ]
    variables = [tf.Variable(w) for w in weights]
    optimizer = LARS(0.5, momentum=0.9, trust_coefficient=0.01, weight_decay=0.001, epsilon=1e-7)
    expected = [w.astype(np.float64) for w in weights]
    velocities = [np.zeros(shape) for shape in shapes]
    for _ in range(3):
        gradients = [rng.standard_normal(shape).astype(np.float32) for shape in shapes]
        optimizer.apply_gradients(zip([tf.constant(g) for g in gradients], variables, strict=True))
        expected = _lars_by_hand(expected, gradients, velocities, 0.5, 0.9, 0.01, 0.001, 1e-7)
    for variable, value in zip(variables, expected, strict=True):
        np.testing.assert_allclose(variable.numpy(), value, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_every_optimizer_builds_and_steps(name: str) -> None:
    optimizer = build_optimizer(TrainConfig(optimizer=name), 0.01)
    variable = tf.Variable(np.ones((3, 2), np.float32))
    optimizer.apply_gradients([(tf.ones((3, 2)), variable)])
    assert np.all(variable.numpy() < 1.0), name


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"optimizer": "adagrad"}, "Input should be 'sgd', 'momentum', 'nesterov', 'lars', 'adam'"),
        ({"optimizer": "adam", "momentum": 0.5}, "--momentum does not apply to --optimizer adam"),
        ({"optimizer": "sgd", "beta_1": 0.8}, "--beta-1 does not apply to --optimizer sgd"),
        ({"optimizer": "adam", "beta_2": 1.0}, "less than 1"),
        ({"optimizer": "adam", "epsilon": 0.0}, "greater than 0"),
        ({"optimizer": "rmsprop", "trust_coefficient": 0.01}, "(it takes: --epsilon, --rho)"),
    ],
)
def test_bad_optimizer_settings_are_refused(fields: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        TrainConfig(**fields)


def test_an_adaptive_optimizer_brings_its_own_learning_rate() -> None:
    assert TrainConfig(optimizer="adam").base_lr == 0.001
    assert TrainConfig(optimizer="adam", dataset="digits").base_lr == 0.001  # not momentum's 0.05
    assert TrainConfig(dataset="digits").base_lr == 0.05
    assert TrainConfig(optimizer="adam", base_lr=0.01).base_lr == 0.01
