"""The tower step: averaging is exact, sum is k x mean, weight decay enters once per step."""

import fixtures_model
import keras
import numpy as np
import pytest
import tensorflow as tf

from towerbench.config.optimizers import OPTIMIZERS
from towerbench.core.errors import TowerbenchError
from towerbench.model.devices import configure_tower_devices, plan_devices
from towerbench.model.gradcheck import run_gradcheck
from towerbench.model.networks import build_network
from towerbench.model.noise_scale import noise_estimates
from towerbench.model.tower_gradients import shard_sizes
from towerbench.model.towers import TowerTrainer

pytestmark = pytest.mark.slow  # trains, or starts servers or processes


def test_averaged_towers_equal_one_device_and_sum_is_k_times_mean():
    towers = fixtures_model.LOGICAL_CPUS
    result = run_gradcheck("tutorial", towers, global_batch=32, seed=3)
    assert result.device_kind == "logical CPU"
    assert len(set(result.devices)) == towers
    assert result.mean_vs_single.max_rel_diff <= 1e-5
    assert result.mean_vs_single.weights_max_rel_diff <= 1e-5
    assert result.mirrored_vs_single.max_rel_diff <= 1e-5
    # k is a power of two: k x mean is the sum exactly, bit for bit.
    assert result.sum_vs_mean.max_abs_diff_from_k_times_mean == 0.0
    assert result.sum_vs_mean.ratio == pytest.approx(towers, rel=1e-6)
    names = [item.variable for item in result.mean_vs_single.per_variable]
    assert "local3/kernel" in names and len(names) == 10


def test_every_optimizer_updates_towers_and_one_device_alike():
    """Three steps of each optimizer (their state included: momentum, Adam's moments, the
    trust ratios of LARS and LAMB) leave k towers and one device with the same weights."""
    result = run_gradcheck(
        "tutorial", 2, global_batch=16, seed=3, input_shape=(8, 8, 1), optimizers=OPTIMIZERS
    )
    checked = {check.optimizer: check for check in result.updates_vs_single}
    assert list(checked) == list(OPTIMIZERS)
    for name, check in checked.items():
        assert check.steps == 3 and check.max_rel_diff <= 1e-5, (name, check)
    assert result.passed
    assert "After 3 steps of each optimizer" in result.explanation


def test_per_tower_batchnorm_equals_ghost_batchnorm_not_global_batchnorm():
    """tutorial_bn: k towers = one device normalising each of the same k shards by itself; BN
    over the whole batch is a different function, and gradcheck says so."""
    towers = fixtures_model.LOGICAL_CPUS
    result = run_gradcheck("tutorial_bn", towers, global_batch=32, seed=3)
    assert result.ghost_vs_mean.max_rel_diff <= 1e-5
    assert result.ghost_vs_mean.weights_max_rel_diff <= 1e-5
    assert result.mean_vs_single.max_rel_diff > 1e-3  # a real difference, not rounding
    assert "ghost" in result.explanation


def _trainer(devices, aggregation, weight_decay, lr=0.5):
    with tf.device(devices.parameter_device):
        network = build_network("tutorial", (8, 8, 1), 10, seed=1)
    return network, TowerTrainer(
        network, keras.optimizers.SGD(lr), devices, aggregation, weight_decay
    )


def test_weight_decay_is_added_once_per_step_not_once_per_tower():
    devices = configure_tower_devices(2)
    images = tf.random.stateless_normal((8, 8, 8, 1), seed=[0, 1])
    labels = tf.random.stateless_uniform((8,), [0, 2], 0, 10, tf.int32)
    network, trainer = _trainer(devices, "sum", weight_decay=0.3)
    before = [v.numpy() for v in network.model.trainable_variables]
    data = [g.numpy() for g in trainer.gradients(images, labels).data_gradients]
    trainer.step(images, labels)
    decayed = {v.path for v in network.decayed_variables}
    for variable, start, gradient in zip(
        network.model.trainable_variables, before, data, strict=True
    ):
        decay = 0.3 * start if variable.path in decayed else 0.0
        np.testing.assert_allclose(
            variable.numpy(), start - 0.5 * (gradient + decay), rtol=1e-5, atol=1e-6
        )
    # The reported term is 0.3 * tf.nn.l2_loss (sum(w**2) / 2) at the step's starting weights.
    expected = 0.3 * sum(
        float(np.sum(start.astype(np.float64) ** 2)) / 2
        for variable, start in zip(network.model.trainable_variables, before, strict=True)
        if variable.path in decayed
    )
    assert float(trainer.metrics.weight_decay_loss.numpy()) == pytest.approx(expected, rel=1e-5)


def test_shard_sizes_and_device_plans():
    assert shard_sizes(10, 4) == [3, 3, 2, 2]
    with pytest.raises(ValueError):
        shard_sizes(3, 4)
    assert plan_devices(4, "auto", 0).kind == "logical CPU"
    assert plan_devices(2, "auto", 4).kind == "physical GPU"
    assert plan_devices(4, "auto", 1).kind == "logical GPU"
    assert plan_devices(2, "cpu", 4).kind == "logical CPU"
    with pytest.raises(TowerbenchError, match="--towers"):
        plan_devices(0, "auto", 0)
    with pytest.raises(TowerbenchError, match="--device-type gpu"):
        plan_devices(1, "gpu", 0)


def test_more_towers_than_the_initialised_runtime_has_is_refused():
    configure_tower_devices(1)  # the runtime is up now
    with pytest.raises(TowerbenchError, match="--towers 64: only 4 CPU"):
        configure_tower_devices(64)


def test_noise_scale_estimator_recovers_known_gradient_and_noise():
    true_sq, trace = 2.0, 300.0
    small, big = 16, 64
    estimated = noise_estimates(true_sq + trace / small, true_sq + trace / big, small, big)
    assert estimated == pytest.approx((true_sq, trace))


def test_resnet20_batchnorm_uses_each_towers_own_batch_statistics():
    # Two halves with different brightness: one device normalises them together, two towers
    # separately, so the gradients must differ (unlike the tutorial network above).
    images = tf.concat(
        [
            tf.random.stateless_normal((4, 8, 8, 1), seed=[1, 1]),
            tf.random.stateless_normal((4, 8, 8, 1), seed=[1, 2]) * 3 + 2,
        ],
        0,
    )
    labels = tf.range(8) % 10
    gradients, moving_means = [], []
    for towers in (1, 2):
        devices = configure_tower_devices(towers)
        with tf.device(devices.parameter_device):
            network = build_network("resnet20", (8, 8, 1), 10, seed=0)
        trainer = TowerTrainer(network, keras.optimizers.SGD(0.1), devices)
        gradients.append([g.numpy() for g in trainer.gradients(images, labels).data_gradients])
        trainer.step(images, labels)
        moving_means.append(network.model.get_layer("conv0_bn").moving_mean.numpy())
    first_conv = [
        np.abs(a - b).max() / np.abs(b).max()
        for a, b in zip(gradients[1], gradients[0], strict=True)
    ][0]
    assert first_conv > 1e-3
    # The towers' moving statistics are averaged: the mean of per-tower batch means equals
    # the whole batch's mean, so the moving means agree.
    np.testing.assert_allclose(moving_means[1], moving_means[0], rtol=1e-4, atol=1e-6)
