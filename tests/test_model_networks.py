"""The networks: the tutorial's exact size and weight-decay placement; ResNet-20's BatchNorm."""

import fixtures_model  # noqa: F401  (logical CPUs before TensorFlow starts)
import keras
import numpy as np
import pytest
import tensorflow as tf

from towerbench.model.networks import LocalResponseNormalization, build_network


def test_tutorial_has_the_tutorials_1068298_parameters_on_cifar10():
    network = build_network("tutorial", (24, 24, 3), 10, seed=0)
    assert network.model.count_params() == 1_068_298
    # Weight decay on the two hidden fully-connected layers only, as in cifar10.py.
    assert [v.path for v in network.decayed_variables] == ["local3/kernel", "local4/kernel"]


def test_tutorial_initialisation_follows_the_tutorial():
    model = build_network("tutorial", (24, 24, 3), 10, seed=0).model
    biases = {
        layer.name: float(layer.bias.numpy().mean())
        for layer in model.layers
        if isinstance(layer, keras.layers.Conv2D | keras.layers.Dense)
    }
    assert biases == pytest.approx(
        {"conv1": 0.0, "conv2": 0.1, "local3": 0.1, "local4": 0.1, "softmax_linear": 0.0}
    )
    # Truncated normal at 2 stddev: |w| <= 2 * 0.04 for local3.
    assert abs(model.get_layer("local3").kernel.numpy()).max() <= 0.08 + 1e-7


def test_resnet20_uses_batchnorm_and_decays_every_kernel():
    network = build_network("resnet20", (32, 32, 3), 10, seed=0)
    norms = [
        layer
        for layer in network.model.layers
        if isinstance(layer, keras.layers.BatchNormalization)
    ]
    assert len(norms) == 19  # one per convolution: 1 + 3 stages x 3 blocks x 2
    assert len(network.decayed_variables) == 20  # 19 convolutions + the classifier
    assert 260_000 < network.model.count_params() < 280_000  # He et al.: 0.27M


def test_tutorial_bn_replaces_each_lrn_by_batchnorm():
    network = build_network("tutorial_bn", (24, 24, 3), 10, seed=0)
    model = network.model
    trainable = sum(int(v.numpy().size) for v in model.trainable_variables)
    moving = sum(int(v.numpy().size) for v in model.non_trainable_variables)
    assert (trainable, moving) == (1_068_298 + 2 * 2 * 64, 2 * 2 * 64)
    kinds = [type(layer).__name__ for layer in model.layers]
    assert "LocalResponseNormalization" not in kinds
    assert [layer.name for layer in model.layers if "BatchNorm" in type(layer).__name__] == [
        "norm1",
        "norm2",
    ]
    assert [v.path for v in network.decayed_variables] == ["local3/kernel", "local4/kernel"]


@pytest.mark.parametrize(("depth_radius", "beta"), [(4, 0.75), (2, 0.5)])
def test_lrn_layer_gives_tensorflows_lrn_values_and_gradients(depth_radius, beta):
    """Channels at both edges of the window included; inputs large enough that the
    normalisation changes them by a factor of 1.6-3."""
    images = tf.constant(np.random.default_rng(0).normal(0, 30, (2, 3, 3, 16)), tf.float32)
    layer = LocalResponseNormalization(depth_radius=depth_radius, beta=beta)

    def with_gradient(function):
        with tf.GradientTape() as tape:
            tape.watch(images)
            outputs = function(images)
            loss = tf.reduce_sum(outputs * tf.range(1.0, 17.0))  # every channel weighted apart
        return outputs.numpy(), tape.gradient(loss, images).numpy()

    ours = with_gradient(layer)
    reference = with_gradient(
        lambda x: tf.nn.local_response_normalization(x, depth_radius, 1.0, 0.001 / 9.0, beta)
    )
    assert np.abs(images.numpy() / ours[0]).max() > 1.5
    np.testing.assert_allclose(ours[0], reference[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ours[1], reference[1], rtol=1e-4, atol=1e-5)
