"""BatchNorm's statistics re-estimated at given weights ("precise BN", Wu & Johnson 2021,
"Rethinking 'Batch' in BatchNorm").

BatchNorm's moving statistics move once per optimizer *step* (moving = m x moving + (1 - m) x
batch statistic), so k towers, which make k times fewer steps per epoch, leave them further
behind the weights at equal epochs: after n steps m^n of the initial statistics is still in them.
Re-estimated, they are the average over a fixed set of training batches of what each batch's
update would add: each tower-sized shard's batch mean and variance, computed in training mode at
the evaluated weights. Evaluating with them measures the weights without that lag.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import keras
import tensorflow as tf

from towerbench.model.losses import true_classes
from towerbench.model.tower_gradients import shard_sizes
from towerbench.model.user_model import layers_of

# Training batches the statistics are re-estimated on (each split into the run's tower shards).
RECOMPUTE_BATCHES = 10


def _updates_in_training(layer: keras.layers.Layer) -> bool:
    """A BatchNorm layer whose moving statistics training updates: not frozen
    (`trainable=False` keeps them), not renormalising (its variance comes from another
    variable), momentum below 1."""
    return (
        isinstance(layer, keras.layers.BatchNormalization)
        and layer.trainable
        and not getattr(layer, "renorm", False)
        and layer.momentum < 1.0
    )


def has_batch_norm(model: keras.Model) -> bool:
    """Whether `model` holds a BatchNorm layer (nested models' included)."""
    return any(isinstance(layer, keras.layers.BatchNormalization) for layer in layers_of(model))


def trains_batch_norm(model: keras.Model) -> bool:
    """Whether training updates any BatchNorm layer's moving statistics in `model`."""
    return any(_updates_in_training(layer) for layer in layers_of(model))


def scale_batch_norm_momentum(model: keras.Model, scaled: Callable[[float], float]) -> None:
    """Every BatchNorm layer's momentum m becomes `scaled(m)` (before the first step traces)."""
    for layer in layers_of(model):
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.momentum = scaled(layer.momentum)


def accuracy_on(
    model: keras.Model, device: str, weights: Sequence, non_trainable: Sequence, batches
) -> float:
    """The share of (images, labels) `batches` classified right with `weights` and the given
    non-trainable values (inference mode)."""
    right = examples = 0
    for images, labels in batches:
        with tf.device(device):
            logits, _ = model.stateless_call(weights, non_trainable, images, training=False)
        predicted = tf.argmax(logits, -1, tf.int32)
        right += int(tf.reduce_sum(tf.cast(predicted == true_classes(labels), tf.int32)))
        examples += int(labels.shape[0])
    return right / max(examples, 1)


class BatchNormStatistics:
    """The model's non-trainable values with the moving mean and variance of every BatchNorm
    layer that training updates replaced by their average over batches, at given weights
    (the other layers keep theirs), each batch split into `towers` shards as the step splits
    it."""

    def __init__(self, model: keras.Model, device: str, towers: int):
        self.model, self.device, self.towers = model, device, towers
        self.non_trainable = list(model.non_trainable_variables)
        # Each moving statistic's update weight 1 - momentum (None: not re-estimated).
        weight: dict[int, float] = {}
        for layer in filter(_updates_in_training, layers_of(model)):
            for variable in (layer.moving_mean, layer.moving_variance):
                weight[id(variable)] = 1.0 - layer.momentum
        self.update_weights = [weight.get(id(v)) for v in self.non_trainable]

        @tf.function(autograph=False)
        def shard_statistics(weights, images):
            """Each moving statistic's batch value on `images` (the others' own value): the
            update of a statistic started at 0, divided by its weight."""
            started = [
                tf.zeros_like(v.value) if w is not None else v.value
                for v, w in zip(self.non_trainable, self.update_weights, strict=True)
            ]
            with tf.device(self.device):
                _, updated = self.model.stateless_call(weights, started, images, training=True)
            return [
                value if w is None else value / w
                for value, w in zip(updated, self.update_weights, strict=True)
            ]

        self.shard_statistics = shard_statistics

    def estimate(self, weights: Sequence, batches: Iterable[tf.Tensor]) -> list[tf.Tensor]:
        """The non-trainable values to evaluate `weights` with: BatchNorm's statistics averaged
        over every shard of `batches`, the rest as they are."""
        values = [tf.convert_to_tensor(w) for w in weights]
        sums: list[tf.Tensor] | None = None
        shards = 0
        for images in batches:
            if int(images.shape[0]) < self.towers:
                continue  # too short to feed every tower (training skips no such batch)
            for shard in tf.split(images, shard_sizes(int(images.shape[0]), self.towers)):
                statistics = self.shard_statistics(values, shard)
                sums = (
                    statistics
                    if sums is None
                    else [a + b for a, b in zip(sums, statistics, strict=True)]
                )
                shards += 1
        if sums is None:
            raise ValueError(f"no training batch of {self.towers} or more examples")
        return [
            variable.value if w is None else total / shards
            for variable, w, total in zip(
                self.non_trainable, self.update_weights, sums, strict=True
            )
        ]
