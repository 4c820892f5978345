"""The tutorial's exponential moving average of the weights, evaluated beside the raw weights."""

from __future__ import annotations

import tensorflow as tf


class WeightAverage:
    """tf.train.ExponentialMovingAverage with num_updates: early steps average faster."""

    def __init__(self, variables: list, decay: float | None):
        self.decay = decay
        self.variables = variables
        self.weights = [tf.Variable(v.value, trainable=False, name="ema") for v in variables]

    def update(self, step: tf.Tensor) -> None:
        """Fold the variables in; `step` counts the optimizer's steps, this one included.
        Without a decay the average stays at the initial weights."""
        if self.decay is None:
            return
        steps = tf.cast(step, tf.float32)
        decay = tf.minimum(self.decay, (1.0 + steps) / (10.0 + steps))
        for average, variable in zip(self.weights, self.variables, strict=True):
            average.assign_sub((1.0 - decay) * (average - variable.value))
