"""The variables of a training step's statistics (AdaScale's averages, the noise scale's): one
value whatever the replica, updated identically on each from all-reduced numbers, so under a
distribution strategy the first replica's is kept. A Keras wrapper passes its own factory to
make them the optimizer's variables (model/keras_adascale.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

NewVariable = Callable[[str, float, tf.DType], Any]


def new_tf_variable(name: str, value: float, dtype: tf.DType) -> tf.Variable:
    """A step statistic as a plain tf.Variable."""
    return tf.Variable(
        value,
        trainable=False,
        dtype=dtype,
        name=name,
        aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
    )
