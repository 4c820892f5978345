"""tf.data input: the tutorial's training distortions and central-crop evaluation, any image size;
other data of any shape and dtype as it is.

Crops, flips and colour distortions (and per-image standardisation) apply to uint8 images
(H, W, 1 or 3) only. Other examples are fed whole, without distortions: floats (and uint8 that is
not an image) as float32, integers (token ids) as int32 for an Embedding layer.

Training reads ONE shuffled stream per epoch and cuts it into global batches; the tower step
splits each batch across the towers, so every example is used once per epoch whatever the number
of towers. The order and the distortions are pure functions of (seed, epoch, position): the
shuffle is seeded per epoch and each example's distortions use stateless random ops seeded by
its position. A resumed run therefore only needs the step number to continue the exact stream
(no shuffle buffer in the checkpoint). With several workers every worker reads the same stream
and keeps its own contiguous slice of each global batch, so the global batches, and every
example's distortions, are those of one process.

The map functions hold no tensor-dependent Python control flow, so AutoGraph is skipped (its
conversion costs every training process time at start).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import tensorflow as tf

from towerbench.core.tfrecord_format import Features
from towerbench.model.tfrecords import decode_example

AUTOTUNE = tf.data.AUTOTUNE
# Records held by the shuffle buffer: the whole training set up to this size (uniform shuffle).
MAX_SHUFFLE_BUFFER = 50_000


@dataclass(frozen=True)
class Distortions:
    """Training distortions (the tutorial's: 24x24 crop, flip, brightness 63, contrast 0.2-1.8)."""

    crop_size: int | None = 24
    random_flip: bool = True
    brightness_delta: float = 63.0
    contrast_lower: float = 0.2
    contrast_upper: float = 1.8

    @classmethod
    def from_config(cls, config) -> Distortions:
        return cls(
            config.crop_size,
            config.random_flip,
            config.brightness_delta,
            config.contrast_lower,
            config.contrast_upper,
        )


def network_input_shape(
    features: Features | Sequence[int], crop_size: int | None
) -> tuple[int, ...]:
    """The shape the network sees: an image's crop, or the whole example."""
    features = Features.of(features)
    if crop_size is None or not features.is_image:
        return features.shape
    return crop_size, crop_size, features.shape[-1]


def undistorted(values: tf.Tensor, features: Features) -> tf.Tensor:
    """Data other than images as the network gets it: int32 token ids, or float32 values."""
    return tf.cast(values, tf.int32 if features.integer else tf.float32)


def distort(image: tf.Tensor, seed: tf.Tensor, distortions: Distortions) -> tf.Tensor:
    """uint8 (H, W, C) -> float32 (crop, crop, C) distorted and standardised; `seed` int64 [2]."""
    crop_seed, flip_seed, brightness_seed, contrast_seed = tf.unstack(
        tf.random.experimental.stateless_split(seed, 4)
    )
    image = tf.cast(image, tf.float32)
    if distortions.crop_size is not None:
        channels = image.shape[-1]
        size = [distortions.crop_size, distortions.crop_size, channels]
        image = tf.image.stateless_random_crop(image, size, crop_seed)
    if distortions.random_flip:
        image = tf.image.stateless_random_flip_left_right(image, flip_seed)
    if distortions.brightness_delta > 0:
        image = tf.image.stateless_random_brightness(
            image, distortions.brightness_delta, brightness_seed
        )
    lower, upper = distortions.contrast_lower, distortions.contrast_upper
    if lower < upper:
        image = tf.image.stateless_random_contrast(image, lower, upper, contrast_seed)
    elif lower != 1.0:
        image = tf.image.adjust_contrast(image, lower)
    return tf.image.per_image_standardization(image)


def evaluation_image(image: tf.Tensor, crop_size: int | None) -> tf.Tensor:
    """uint8 (H, W, C) -> float32 central crop, standardised (the tutorial's eval input)."""
    image = tf.cast(image, tf.float32)
    if crop_size is not None:
        image = tf.image.resize_with_crop_or_pad(image, crop_size, crop_size)
    return tf.image.per_image_standardization(image)


@dataclass(frozen=True)
class EpochPlan:
    """How a training split of `examples` is cut into global batches for `towers` towers
    (over all workers)."""

    examples: int
    global_batch: int
    towers: int
    workers: int = 1

    @property
    def used_examples(self) -> int:
        """All examples, but the last partial batch is cut to a multiple of the workers (equal
        slices) and dropped when smaller than the tower count."""
        remainder = self.examples % self.global_batch
        kept = remainder - remainder % self.workers
        return self.examples - remainder + (kept if kept >= self.towers else 0)

    @property
    def steps(self) -> int:
        return -(-self.used_examples // self.global_batch)


def _records(files: Sequence[str]) -> tf.data.Dataset:
    # Reading shards in parallel keeps a fixed (round-robin) order: deterministic.
    return tf.data.TFRecordDataset(list(files), num_parallel_reads=min(len(files), 8))


def train_dataset(
    files: Sequence[str],
    features: Features | Sequence[int],
    plan: EpochPlan,
    distortions: Distortions,
    seed: int,
    epoch: int,
    start_step: int = 0,
    worker: int = 0,
) -> tf.data.Dataset:
    """Epoch `epoch`'s batches from step `start_step` on: (images (B, h, w, C) f32, labels (B,)),
    or for other data (examples (B, ...) f32 or int32, labels); with several workers worker
    `worker`'s slices of them (B / workers examples). `distortions` apply to images only."""
    features = Features.of(features)
    stream_seed = seed * 1_000_003 + epoch  # a fresh order every epoch, the same on resume

    @tf.autograph.experimental.do_not_convert
    def prepare(index: tf.Tensor, record: tf.Tensor):
        values, label = decode_example(record, features)
        if not features.is_image:
            return undistorted(values, features), label
        example_seed = tf.stack([tf.constant(stream_seed, tf.int64), index])
        return distort(values, example_seed, distortions), label

    records = _records(files).shuffle(
        min(plan.examples, MAX_SHUFFLE_BUFFER), seed=stream_seed, reshuffle_each_iteration=False
    )
    positioned = records.take(plan.used_examples).enumerate().skip(start_step * plan.global_batch)
    if plan.workers > 1:

        @tf.autograph.experimental.do_not_convert
        def worker_slice(indices: tf.Tensor, batch_records: tf.Tensor):
            size = tf.shape(indices, out_type=tf.int64)[0] // plan.workers
            return (
                indices[worker * size : (worker + 1) * size],
                batch_records[worker * size : (worker + 1) * size],
            )

        positioned = positioned.batch(plan.global_batch).map(worker_slice).unbatch()
    return (
        positioned.map(prepare, num_parallel_calls=AUTOTUNE)
        .batch(plan.global_batch // plan.workers)
        .prefetch(AUTOTUNE)
    )


def evaluation_dataset(
    files: Sequence[str], features: Features | Sequence[int], crop_size: int | None, batch: int
) -> tf.data.Dataset:
    """Every example exactly once, in fixed-size batches: (images, labels, mask).

    The final partial batch is padded to `batch` (zeros, mask False), so one compiled
    evaluation function serves every batch and padding is never counted.
    """
    features = Features.of(features)

    @tf.autograph.experimental.do_not_convert
    def prepare(record: tf.Tensor):
        values, label = decode_example(record, features)
        if not features.is_image:
            return undistorted(values, features), label
        return evaluation_image(values, crop_size), label

    @tf.autograph.experimental.do_not_convert
    def pad(images: tf.Tensor, labels: tf.Tensor):
        present = tf.shape(labels)[0]
        missing = batch - present
        images = tf.pad(images, [[0, missing]] + [[0, 0]] * len(features.shape))
        labels = tf.pad(labels, [[0, missing]] + [[0, 0]] * (labels.shape.rank - 1))
        images.set_shape([batch, *images.shape[1:]])
        labels.set_shape([batch, *labels.shape[1:]])
        return images, labels, tf.range(batch) < present

    return (
        _records(files)
        .map(prepare, num_parallel_calls=AUTOTUNE)
        .batch(batch)
        .map(pad, num_parallel_calls=AUTOTUNE)
        .prefetch(AUTOTUNE)
    )
