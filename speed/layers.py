"""Where a training step's time goes: each layer's forward and backward pass, timed on its own.

Every layer of the benchmark network gets a random input of the shape it sees in training and
computes its output and the gradients of a sum of that output (its weights', and its input's
except for the first layer: training never differentiates the images). The layers are timed
round-robin. Alone, each pays its own call and memory traffic, so their sum can exceed a whole
step: their shares say which layers bound it.
"""

from __future__ import annotations

from collections.abc import Callable

import keras
import tensorflow as tf

from towerbench.config.sections import TrainConfig
from towerbench.model.networks import build_network
from towerbench.speed.timing import time_once
from towerbench.speed.workload import IMAGE_SHAPE, NETWORK, NUM_CLASSES


def _layer_runner(
    layer: keras.layers.Layer, batch: int, steps: int, device: str, needs_input_gradient: bool
) -> Callable[[], float]:
    with tf.device(device):
        inputs = tf.random.stateless_normal((batch, *layer.input.shape[1:]), seed=(0, 0))

    @tf.function(autograph=False)
    def forward_backward(x: tf.Tensor) -> list[tf.Tensor]:
        with tf.device(device), tf.GradientTape() as tape:
            tape.watch(x)
            total = tf.reduce_sum(layer(x, training=True))
        sources = [x, *layer.trainable_weights] if needs_input_gradient else layer.trainable_weights
        gradients = tape.gradient(total, sources)
        return [total] + [gradient for gradient in gradients if gradient is not None]

    def run() -> float:
        def passes() -> None:
            for _ in range(steps):
                outputs = forward_backward(inputs)
            outputs[0].numpy()  # wait for the last pass

        return time_once(passes) / steps

    return run


def layer_runners(
    batch: int, steps: int, device: str, config: TrainConfig
) -> dict[str, Callable[[], float]]:
    """Layer name -> a callable returning seconds per forward + backward pass at `batch`."""
    with tf.device(device):
        network = build_network(NETWORK, IMAGE_SHAPE, NUM_CLASSES, config.seed)
    layers = [
        layer for layer in network.model.layers if not isinstance(layer, keras.layers.InputLayer)
    ]
    return {
        layer.name: _layer_runner(layer, batch, steps, device, needs_input_gradient=index > 0)
        for index, layer in enumerate(layers)
    }
