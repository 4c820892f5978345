"""Mixed precision: float32 master weights under float16/bfloat16 layers, and float16's dynamic
loss scale, which skips a step whose gradients overflow (still counting it) and halves."""

from __future__ import annotations

from dataclasses import replace

import keras
import numpy as np
import pytest
import tensorflow as tf

from towerbench.model.devices import configure_tower_devices
from towerbench.model.gradcheck import TOLERANCE
from towerbench.model.networks import build_network
from towerbench.model.precision import GROWTH_STEPS, INITIAL_SCALE, LossScale
from towerbench.model.towers import TowerTrainer


@pytest.mark.parametrize("precision", ["mixed_float16", "mixed_bfloat16"])
def test_layers_compute_in_16_bits_while_weights_and_logits_stay_float32(precision) -> None:
    network = build_network("tutorial", (24, 24, 3), 10, seed=0, precision=precision)
    assert {v.dtype for v in network.model.trainable_variables} == {"float32"}
    conv = network.model.get_layer("conv1")
    assert conv.compute_dtype == precision.removeprefix("mixed_")
    logits = network.model(tf.zeros((2, 24, 24, 3)))
    assert logits.dtype == tf.float32
    assert keras.config.dtype_policy().name == "float32"  # the global policy is restored


def test_an_overflowing_step_is_skipped_counted_and_halves_the_scale() -> None:
    variable = tf.Variable([1.0, 2.0])
    optimizer = keras.optimizers.SGD(0.5)
    optimizer.build([variable])
    scale = LossScale("mixed_float16")
    apply = tf.function(lambda g: scale.apply(optimizer, [g], [variable]))

    apply(tf.constant([np.inf, 1.0]))
    assert variable.numpy().tolist() == [1.0, 2.0]  # skipped
    assert int(optimizer.iterations.numpy()) == 1  # but counted: the schedule keeps its pace
    assert float(scale.scale.numpy()) == INITIAL_SCALE / 2

    apply(tf.constant([2.0, 2.0]))
    assert variable.numpy().tolist() == [0.0, 1.0]
    assert int(scale.good_steps.numpy()) == 1 and int(optimizer.iterations.numpy()) == 2
    scale.good_steps.assign(GROWTH_STEPS - 1)
    apply(tf.constant([0.0, 0.0]))
    assert float(scale.scale.numpy()) == INITIAL_SCALE  # doubled after GROWTH_STEPS good steps


def test_float32_and_bfloat16_need_no_scale() -> None:
    assert not LossScale("float32").dynamic and not LossScale("mixed_bfloat16").dynamic
    assert float(LossScale("mixed_bfloat16").scale.numpy()) == 1.0


@pytest.mark.slow
def test_float16_towers_agree_with_one_float16_device_within_the_stated_tolerance() -> None:
    """Loss-scaled float16: 2 towers against 1 device, same weights and batch (gradcheck's
    comparison, in-process)."""
    devices = configure_tower_devices(2)
    one_device = replace(devices, devices=devices.devices[:1], replicas=1)
    images = tf.random.stateless_normal((16, 24, 24, 3), seed=[0, 1])
    labels = tf.random.stateless_uniform((16,), [0, 2], 0, 10, tf.int32)
    initial = build_network("tutorial", (24, 24, 3), 10, seed=0).model.get_weights()
    trainers = []
    for tower_devices in (devices, one_device):
        network = build_network("tutorial", (24, 24, 3), 10, seed=0, precision="mixed_float16")
        network.model.set_weights(initial)
        optimizer = keras.optimizers.SGD(0.1)
        trainers.append(TowerTrainer(network, optimizer, tower_devices, precision="mixed_float16"))
    towers, single = (trainer.gradients(images, labels).data_gradients for trainer in trainers)
    worst = max(
        float(tf.reduce_max(tf.abs(a - b)) / tf.reduce_max(tf.abs(b)))
        for a, b in zip(towers, single, strict=True)
    )
    assert worst <= TOLERANCE["mixed_float16"]
    trainers[0].step(images, labels)
    assert float(trainers[0].loss_scale.scale.numpy()) == INITIAL_SCALE  # finite: not skipped
