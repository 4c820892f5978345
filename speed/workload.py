"""The benchmark's fixed workload: the `tutorial` network on CIFAR-10-shaped batches."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

NETWORK = "tutorial"
# CIFAR-10 after the tutorial's 24x24 random crop: what the network sees during training.
IMAGE_SHAPE = (24, 24, 3)
NUM_CLASSES = 10


def synthetic_batch(
    global_batch: int, seed: int = 0, image_shape: tuple[int, ...] = IMAGE_SHAPE
) -> tuple[tf.Tensor, tf.Tensor]:
    """A fixed batch of standardised images (B, *image_shape) float32 and labels (B,) int32.

    Step timings feed the same batch every step so they measure the step, not the input
    pipeline (measured on its own).
    """
    rng = np.random.default_rng(seed)
    images = rng.standard_normal((global_batch, *image_shape), dtype=np.float32)
    labels = rng.integers(0, NUM_CLASSES, size=global_batch, dtype=np.int32)
    return tf.constant(images), tf.constant(labels)
