"""Decoding the TFRecords of core/tfrecord_format.py's data contract into tensors."""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from towerbench.core.tfrecord_format import Features


def decode_example(
    serialized: tf.Tensor, features: Features | Sequence[int] | None = None
) -> tuple[tf.Tensor, tf.Tensor]:
    """One serialised example -> (values [*shape] of its dtype, label): the label is an int32
    class id [], or a float32 row [columns] where `features.label_columns` says so.

    Pass `features=manifest.features` (a bare shape means uint8 pixels, as `image_shape` always
    did) to get a fully static shape (what Keras layers and XLA want); without it the example is
    an image whose [H, W, C] comes from the record and is only known at run time.
    """
    known = None if features is None else Features.of(features)
    rank = 3 if known is None else len(known.shape)
    columns = None if known is None else known.label_columns
    label = (
        tf.io.FixedLenFeature([], tf.int64)
        if columns is None
        else tf.io.FixedLenFeature([columns], tf.float32)
    )
    parsed = tf.io.parse_single_example(
        serialized,
        {
            "image": tf.io.FixedLenFeature([], tf.string),
            "label": label,
            "shape": tf.io.FixedLenFeature([rank], tf.int64),
        },
    )
    dtype = tf.uint8 if known is None else tf.dtypes.as_dtype(known.dtype)
    values = tf.io.decode_raw(parsed["image"], dtype, little_endian=True)
    shape = parsed["shape"] if known is None else list(known.shape)
    labels = parsed["label"] if columns is not None else tf.cast(parsed["label"], tf.int32)
    return tf.reshape(values, shape), labels
