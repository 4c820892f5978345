"""The machine's dense float32 matmul rate: the roofline our training step is compared with."""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf

from towerbench.speed.timing import time_once

ROOFLINE_SIZES = (2048, 4096)


def matmul_flops(size: int) -> int:
    """Floating-point operations of one size x size by size x size product (a multiply and an add
    per inner-product term)."""
    return 2 * size**3


def matmul_runner(size: int, device: str, seed: int = 0) -> Callable[[], float]:
    """A callable timing one float32 size x size product on `device` (seconds).

    The operands are made once; only the product is timed. Reading one element back forces the
    asynchronous executor to finish without copying the whole result.
    """
    with tf.device(device):
        generator = tf.random.Generator.from_seed(seed)
        left = generator.normal([size, size], dtype=tf.float32)
        right = generator.normal([size, size], dtype=tf.float32)

    @tf.function
    def product() -> tf.Tensor:
        with tf.device(device):
            return tf.matmul(left, right)[0, 0]

    return lambda: time_once(lambda: product().numpy())
