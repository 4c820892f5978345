"""Decoding the TFRecords of core/tfrecord_format.py's data contract into tensors."""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf


def decode_example(
    serialized: tf.Tensor, image_shape: Sequence[int] | None = None
) -> tuple[tf.Tensor, tf.Tensor]:
    """One serialised example -> (image uint8 [H, W, C], label int32 []).

    Pass `image_shape=manifest.image_shape` to get a fully static shape (what Keras layers and
    XLA want); without it the shape comes from the record and is only known at run time.
    """
    features = tf.io.parse_single_example(
        serialized,
        {
            "image": tf.io.FixedLenFeature([], tf.string),
            "label": tf.io.FixedLenFeature([], tf.int64),
            "shape": tf.io.FixedLenFeature([3], tf.int64),
        },
    )
    pixels = tf.io.decode_raw(features["image"], tf.uint8)
    if image_shape is None:
        image = tf.reshape(pixels, features["shape"])
    else:
        image = tf.reshape(pixels, [int(size) for size in image_shape])
    return image, tf.cast(features["label"], tf.int32)
