"""The peer towerbench must beat: the same network under Keras `model.fit` + MirroredStrategy.

This is what a TensorFlow user writes instead of a tower loop: the network built inside a
`MirroredStrategy` scope, the tutorial's weight decay as Keras L2 regularizers, the configured
optimizer (model/optimizers.py) with the tutorial's moving average of the weights (`use_ema`),
sparse cross-entropy and accuracy, `fit`.
Keras defaults apply (no XLA on CPU-only machines, one step per execution) unless the caller
asks for the precision and XLA setting towerbench's side runs with (a user's model, which keeps
its own regularizers).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import keras
import tensorflow as tf

from towerbench.config.sections import TrainConfig
from towerbench.model.networks import build_network
from towerbench.model.optimizers import build_optimizer
from towerbench.model.precision import Precision
from towerbench.speed.workload import IMAGE_SHAPE, NETWORK, NUM_CLASSES, synthetic_batch


class _StepClock(keras.callbacks.Callback):
    """Times the steps after the first of a `fit` call, leaving out fit's set-up and tear-down."""

    def __init__(self) -> None:
        super().__init__()
        self.first_end = 0.0
        self.last_end = 0.0
        self.steps_after_first = -1

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        # TensorFlow runs a step synchronously on CPU; on GPUs the loss read below waits for it.
        if logs and "loss" in logs:
            float(logs["loss"])
        self.last_end = time.perf_counter()
        if self.steps_after_first < 0:
            self.first_end = self.last_end
        self.steps_after_first += 1


def keras_mirrored_runner(
    devices: list[str],
    global_batch: int,
    steps: int,
    config: TrainConfig,
    network_name: str = NETWORK,
    image_shape: tuple[int, ...] = IMAGE_SHAPE,
    precision: Precision = "float32",
    jit_compile: bool | str = "auto",
) -> Callable[[], float]:
    """A callable that runs `fit` for `steps + 1` steps and returns seconds per step (steady).
    The network is built inside the strategy's scope, its layers computing in `precision`
    (float16 with Keras' dynamic loss scale, as towerbench's step has its own)."""
    strategy = tf.distribute.MirroredStrategy(devices=devices)
    with strategy.scope():
        network = build_network(network_name, image_shape, NUM_CLASSES, config.seed, precision)
        for variable in network.decayed_variables:
            # tf.nn.l2_loss is sum(w**2)/2, so the tutorial's 0.004 is Keras L2(0.002).
            variable.regularizer = keras.regularizers.L2(config.l2_weight_decay / 2)
        model = network.model
        optimizer = build_optimizer(
            config, config.base_lr, use_ema=True, ema_momentum=config.ema_decay
        )
        if precision == "mixed_float16":
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
        model.compile(
            optimizer=optimizer,
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["sparse_categorical_accuracy"],
            jit_compile=jit_compile,
        )
    images, labels = synthetic_batch(global_batch, config.seed, image_shape)
    # One element is one global batch; the strategy splits it across the replicas.
    dataset = tf.data.Dataset.from_tensors((images, labels)).repeat()

    def run() -> float:
        clock = _StepClock()
        model.fit(
            dataset,
            epochs=1,
            steps_per_epoch=steps + 1,
            shuffle=False,
            verbose=0,
            callbacks=[clock],
        )
        return (clock.last_end - clock.first_end) / clock.steps_after_first

    return run
