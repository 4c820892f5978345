"""The networks: the TensorFlow CIFAR-10 tutorial's CNN and ResNet-20 (He et al. 2016).

Each builder returns a `Network`: the Keras model (logits out) and the kernels that L2 weight decay
applies to, because the tutorial decays only its two hidden fully-connected layers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import keras
import tensorflow as tf

from towerbench.model.precision import Precision, layers_in
from towerbench.model.user_model import build_user_model


@dataclass
class Network:
    """A Keras model producing logits, and the variables weight decay applies to."""

    model: keras.Model
    decayed_variables: list[keras.Variable]


@keras.saving.register_keras_serializable(package="towerbench")
class LocalResponseNormalization(keras.layers.Layer):
    """Local response normalisation over channels, as in AlexNet and the tutorial:

        y = x / (bias + alpha * sum of x**2 over the 2 * depth_radius + 1 nearest channels)**beta

    the values of tf.nn.local_response_normalization. The window sums are one product with a
    banded channels x channels matrix, and beta = 0.75 (the tutorial's) is two reciprocal square
    roots, not a power: forward and backward together 3-4x faster than that op on the 2-core
    AVX-512 CPU of docs/benchmarks.md, and a fifth off the tutorial's training step there.
    """

    def __init__(self, depth_radius=4, bias=1.0, alpha=0.001 / 9.0, beta=0.75, **kwargs):
        super().__init__(**kwargs)
        self.depth_radius, self.bias, self.alpha, self.beta = depth_radius, bias, alpha, beta

    def call(self, inputs):
        # Computed in float32 under mixed precision: a sum of squares and a power.
        x = tf.cast(inputs, tf.float32)
        channels = x.shape[-1]
        offsets = tf.range(channels)
        window = tf.cast(tf.abs(offsets[:, None] - offsets[None, :]) <= self.depth_radius, x.dtype)
        sums = tf.reshape(tf.matmul(tf.reshape(tf.square(x), [-1, channels]), window), tf.shape(x))
        denominator = self.bias + self.alpha * sums
        if self.beta == 0.75:  # d**-0.75 = d**-0.5 * d**-0.25
            scale = tf.math.rsqrt(denominator) * tf.math.rsqrt(tf.sqrt(denominator))
        else:
            scale = tf.pow(denominator, -self.beta)
        return tf.cast(x * scale, inputs.dtype)

    def get_config(self):
        return {
            **super().get_config(),
            "depth_radius": self.depth_radius,
            "bias": self.bias,
            "alpha": self.alpha,
            "beta": self.beta,
        }


@keras.saving.register_keras_serializable(package="towerbench")
class SubsampleAndPad(keras.layers.Layer):
    """ResNet option-A shortcut: take every `stride`-th pixel, zero-pad the new channels."""

    def __init__(self, stride: int, extra_channels: int, **kwargs):
        super().__init__(**kwargs)
        self.stride, self.extra_channels = stride, extra_channels

    def call(self, inputs):
        subsampled = inputs[:, :: self.stride, :: self.stride, :]
        half = self.extra_channels // 2
        return tf.pad(subsampled, [[0, 0], [0, 0], [0, 0], [half, self.extra_channels - half]])

    def get_config(self):
        return {
            **super().get_config(),
            "stride": self.stride,
            "extra_channels": self.extra_channels,
        }


def _truncated(stddev: float, seed: int) -> keras.initializers.Initializer:
    return keras.initializers.TruncatedNormal(stddev=stddev, seed=seed)


def _hidden_dense(units: int, name: str, seed: int) -> keras.layers.Dense:
    """The tutorial's hidden fully-connected layer: ReLU, stddev 0.04, bias 0.1."""
    return keras.layers.Dense(
        units,
        activation="relu",
        name=name,
        kernel_initializer=_truncated(0.04, seed),
        bias_initializer=keras.initializers.Constant(0.1),
    )


def _tutorial_layers(seed: int, num_classes: int) -> dict[str, keras.layers.Layer]:
    """The tutorial's convolutions and fully-connected layers, with its initialisers."""
    conv, dense = keras.layers.Conv2D, keras.layers.Dense
    return {
        "conv1": conv(
            64,
            5,
            padding="same",
            activation="relu",
            name="conv1",
            kernel_initializer=_truncated(5e-2, seed),
            bias_initializer="zeros",
        ),
        "conv2": conv(
            64,
            5,
            padding="same",
            activation="relu",
            name="conv2",
            kernel_initializer=_truncated(5e-2, seed + 1),
            bias_initializer=keras.initializers.Constant(0.1),
        ),
        "local3": _hidden_dense(384, "local3", seed + 2),
        "local4": _hidden_dense(192, "local4", seed + 3),
        "softmax_linear": dense(
            num_classes,
            name="softmax_linear",
            kernel_initializer=_truncated(1 / 192.0, seed + 4),
            bias_initializer="zeros",
        ),
    }


def _tutorial(
    input_shape: Sequence[int], num_classes: int, seed: int, normalization: str
) -> Network:
    """conv1 -> pool1 -> norm1 -> conv2 -> norm2 -> pool2 -> local3 -> local4 -> logits, with
    `normalization` "lrn" (the tutorial) or "batchnorm" in both norm places."""

    def norm(name: str) -> keras.layers.Layer:
        if normalization == "lrn":
            return LocalResponseNormalization(name=name)
        return keras.layers.BatchNormalization(momentum=0.9, epsilon=1e-5, name=name)

    layers = _tutorial_layers(seed, num_classes)
    inputs = keras.Input(shape=tuple(input_shape), name="images")  # (B, H, W, C) standardised
    x = layers["conv1"](inputs)
    x = keras.layers.MaxPooling2D(3, 2, padding="same", name="pool1")(x)
    x = norm("norm1")(x)
    x = layers["conv2"](x)
    x = norm("norm2")(x)
    x = keras.layers.MaxPooling2D(3, 2, padding="same", name="pool2")(x)
    x = keras.layers.Flatten(name="flatten")(x)  # (B, ceil(H/4) * ceil(W/4) * 64)
    x = layers["local4"](layers["local3"](x))
    logits = layers["softmax_linear"](x)
    name = "tutorial" if normalization == "lrn" else "tutorial_bn"
    model = keras.Model(inputs, logits, name=name)
    # The tutorial puts weight decay 0.004 on local3 and local4 only.
    return Network(model, [layers["local3"].kernel, layers["local4"].kernel])


def tutorial_network(input_shape: Sequence[int], num_classes: int, seed: int) -> Network:
    """The CIFAR-10 tutorial's CNN (cifar10.py `inference`): 1,068,298 parameters on 24x24x3."""
    return _tutorial(input_shape, num_classes, seed, "lrn")


def tutorial_bn_network(input_shape: Sequence[int], num_classes: int, seed: int) -> Network:
    """The tutorial's CNN with BatchNorm in place of each LRN: 1,068,554 trainable parameters on
    24x24x3 (+256 for two gammas and betas) and 256 moving statistics. In towers every BatchNorm
    normalises its own tower's shard (Goyal et al.'s per-worker statistics): a different function
    from BatchNorm over the whole global batch."""
    return _tutorial(input_shape, num_classes, seed, "batchnorm")


def resnet20_network(input_shape: Sequence[int], num_classes: int, seed: int) -> Network:
    """ResNet-20 for CIFAR (He et al. 2016, section 4.2): 3 stages x 3 basic blocks, option-A
    shortcuts, BatchNorm. In towers each BatchNorm normalises with its own tower's batch."""
    seeds = iter(range(seed, seed + 100))
    kernels: list[keras.layers.Layer] = []

    def conv_bn(x, filters: int, stride: int, name: str, relu: bool = True):
        layer = keras.layers.Conv2D(
            filters,
            3,
            strides=stride,
            padding="same",
            use_bias=False,
            name=name,
            kernel_initializer=keras.initializers.HeNormal(seed=next(seeds)),
        )
        kernels.append(layer)
        x = layer(x)
        x = keras.layers.BatchNormalization(momentum=0.9, epsilon=1e-5, name=name + "_bn")(x)
        return keras.layers.ReLU(name=name + "_relu")(x) if relu else x

    inputs = keras.Input(shape=tuple(input_shape), name="images")
    x = conv_bn(inputs, 16, 1, "conv0")
    channels = 16
    for stage, filters in enumerate((16, 32, 64)):
        for block in range(3):
            stride = 2 if stage > 0 and block == 0 else 1
            name = f"stage{stage + 1}_block{block + 1}"
            y = conv_bn(x, filters, stride, name + "_conv1")
            y = conv_bn(y, filters, 1, name + "_conv2", relu=False)
            if stride != 1 or channels != filters:
                x = SubsampleAndPad(stride, filters - channels, name=name + "_shortcut")(x)
            x = keras.layers.ReLU(name=name + "_out")(keras.layers.Add(name=name + "_add")([x, y]))
            channels = filters
    x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
    head = keras.layers.Dense(
        num_classes, name="logits", kernel_initializer=keras.initializers.HeNormal(seed=next(seeds))
    )
    kernels.append(head)
    model = keras.Model(inputs, head(x), name="resnet20")
    return Network(model, [layer.kernel for layer in kernels])


def build_network(
    name: str,
    input_shape: Sequence[int],
    num_classes: int,
    seed: int,
    precision: Precision = "float32",
    loss: str = "sparse_categorical_crossentropy",
) -> Network:
    """Build network `name` for images of `input_shape` (H, W, C) and `num_classes` classes
    (the output width `loss` needs), its layers computing in `precision` (model.precision);
    outputs are float32 either way. `name` is a built-in network or a reference to the user's
    function (config.model_ref): that one is called under the same dtype policy, checked
    against `loss` (model.user_model), and its own regularizers are its weight decay."""
    builders = {
        "tutorial": tutorial_network,
        "tutorial_bn": tutorial_bn_network,
        "resnet20": resnet20_network,
    }
    with layers_in(precision):
        if name in builders:
            network = builders[name](input_shape, num_classes, seed)
        else:
            model = build_user_model(name, input_shape, num_classes, precision, loss)
            network = Network(model, [])
    # The cross-entropy is taken in float32: 16-bit logits (mixed precision, or a user's last
    # layer given a 16-bit dtype) are cast by one more layer.
    if precision == "float32" and network.model.outputs[0].dtype == "float32":
        return network
    logits = keras.layers.Activation("linear", dtype="float32", name="logits_float32")
    model = keras.Model(
        network.model.inputs, logits(network.model.outputs[0]), name=network.model.name
    )
    return Network(model, network.decayed_variables)
