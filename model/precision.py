"""Mixed precision: layers compute in float16 or bfloat16 while the variables (the master weights)
and every update stay float32; float16 also needs its loss scaled.

With `mixed_float16` each tower's loss is multiplied by a dynamic loss scale S (a power of 2)
before backpropagation, so small activation gradients do not underflow in float16; the combined
gradients are divided by S again (exact: S is a power of 2). A step whose gradients overflow is
skipped and S halved; after `GROWTH_STEPS` good steps S doubles (as Keras' LossScaleOptimizer,
but a skipped step still counts as a step, so the LR schedule and resuming count steps as usual).
bfloat16 has float32's exponent range and needs no scaling.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Literal

import keras
import tensorflow as tf

Precision = Literal["float32", "mixed_float16", "mixed_bfloat16"]

INITIAL_SCALE = 2.0**15
GROWTH_STEPS = 2000


@contextlib.contextmanager
def layers_in(precision: Precision) -> Iterator[None]:
    """Layers built inside compute in `precision`'s dtype, with float32 variables."""
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(precision)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)


class LossScale(tf.Module):
    """The dynamic loss scale of float16 (a constant 1 for the other precisions)."""

    def __init__(self, precision: Precision):
        super().__init__(name="loss_scale")
        self.dynamic = precision == "mixed_float16"
        self.scale = tf.Variable(INITIAL_SCALE if self.dynamic else 1.0, trainable=False)
        self.good_steps = tf.Variable(0, trainable=False, dtype=tf.int64)

    def apply(self, optimizer, gradients: list[tf.Tensor], variables: list) -> None:
        """One optimizer step with unscaled `gradients`, or, if any is not finite (float16
        overflow), a skipped step and half the scale."""
        if not self.dynamic:
            optimizer.apply(gradients, variables)
            return
        finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in gradients])

        def step():
            optimizer.apply(gradients, variables)
            grow = self.good_steps == GROWTH_STEPS - 1
            self.scale.assign(tf.where(grow, self.scale * 2.0, self.scale))
            self.good_steps.assign(tf.where(grow, tf.constant(0, tf.int64), self.good_steps + 1))

        def skip():
            optimizer.iterations.assign_add(1)
            self.scale.assign(self.scale * 0.5)
            self.good_steps.assign(0)

        tf.cond(finite, step, skip)
