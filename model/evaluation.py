"""Evaluation on the test split: every test example counted exactly once (the last, padded batch
is masked), giving the confusion matrix and the mean test loss (train.loss) of the given weights."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from towerbench.core.tfrecord_format import Features
from towerbench.model.input_pipeline import evaluation_dataset
from towerbench.model.losses import per_example_loss, true_classes

EVAL_BATCH = 500


def accuracy(confusion: np.ndarray) -> float:
    return float(np.trace(confusion) / max(confusion.sum(), 1))


class Evaluator:
    """Confusion matrix and mean loss of given weights on the whole test split (a loss with one
    class per example: a class id, or a label row's largest value)."""

    def __init__(
        self,
        model,
        device: str,
        files: Sequence[str],
        features: Features | Sequence[int],
        crop_size: int | None,
        classes: int,
        loss: str = "sparse_categorical_crossentropy",
    ):
        self.dataset = evaluation_dataset(files, features, crop_size, EVAL_BATCH)
        self.model, self.device, self.classes = model, device, classes
        self.non_trainable = model.non_trainable_variables
        per_example = per_example_loss(loss)

        @tf.function(autograph=False)  # no tensor-dependent Python control flow
        def predict_batch(weights, non_trainable, images, labels, mask):
            with tf.device(self.device):
                logits, _ = self.model.stateless_call(
                    weights, non_trainable, images, training=False
                )
                predictions = tf.argmax(logits, -1, tf.int32)
                losses = per_example(labels, logits)
            # Padding (mask False) gets weight 0: counted nowhere.
            confusion = tf.math.confusion_matrix(
                tf.where(mask, true_classes(labels), 0),
                predictions,
                self.classes,
                weights=tf.cast(mask, tf.int64),
                dtype=tf.int64,
            )
            return confusion, tf.reduce_sum(tf.where(mask, losses, 0.0))

        self.predict_batch = predict_batch

    def evaluate(self, weights, non_trainable=None) -> tuple[np.ndarray, float]:
        """(confusion matrix [true, predicted class], mean test loss) of `weights`,
        with the model's own non-trainable values (BatchNorm's moving statistics) unless
        `non_trainable` gives others (model.batch_norm_statistics)."""
        values = [tf.convert_to_tensor(w) for w in weights]
        state = [
            tf.convert_to_tensor(v)
            for v in (non_trainable or [v.value for v in self.non_trainable])
        ]
        total = np.zeros((self.classes, self.classes), np.int64)
        cross_entropy = 0.0
        for images, labels, mask in self.dataset:
            confusion, loss_sum = self.predict_batch(values, state, images, labels, mask)
            total += confusion.numpy()
            cross_entropy += float(loss_sum.numpy())
        return total, cross_entropy / max(int(total.sum()), 1)
