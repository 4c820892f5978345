"""Evaluation on the test split: every test example counted exactly once (the last, padded batch
is masked), giving the mean test loss (train.loss) of the given weights and their metric
(train.metric): accuracy from the confusion matrix, the others (model.metric_values) from the
split's outputs and label rows. A retrieval run (recall@K) ranks every test query against one
fixed set of test candidates on this device, so its metric and test loss (the softmax over that
set) are the same whatever the towers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import tensorflow as tf

from towerbench.config.metrics import recall_cutoff
from towerbench.core.tfrecord_format import Features
from towerbench.model.input_pipeline import evaluation_dataset
from towerbench.model.losses import per_example_loss, true_classes
from towerbench.model.metric_values import VALUES, retrieval

EVAL_BATCH = 500


def accuracy(confusion: np.ndarray) -> float:
    return float(np.trace(confusion) / max(confusion.sum(), 1))


class Evaluation(NamedTuple):
    """One set of weights on the whole test split."""

    loss: float  # mean over the examples
    metric: float  # train.metric's value
    examples: int
    confusion: np.ndarray | None  # [true, predicted class]; accuracy only


class Evaluator:
    """Mean loss and metric (with accuracy, the confusion matrix) of given weights on the whole
    test split."""

    def __init__(
        self,
        model,
        device: str,
        files: Sequence[str],
        features: Features | Sequence[int],
        crop_size: int | None,
        classes: int,
        loss: str = "sparse_categorical_crossentropy",
        metric: str = "accuracy",
        temperature: float = 1.0,
        eval_candidates: int = 1000,
    ):
        self.dataset = evaluation_dataset(files, features, crop_size, EVAL_BATCH)
        self.model, self.device, self.classes = model, device, classes
        self.metric, self.recall_k = metric, recall_cutoff(metric)
        self.temperature, self.eval_candidates = temperature, eval_candidates
        self.non_trainable = model.non_trainable_variables
        per_example = per_example_loss(loss, temperature)

        @tf.function(autograph=False)  # no tensor-dependent Python control flow
        def predict_batch(weights, non_trainable, images, labels, mask):
            with tf.device(self.device):
                outputs, _ = self.model.stateless_call(
                    weights, non_trainable, images, training=False
                )
                if self.recall_k is not None:  # its loss is over the whole split's candidates
                    return tf.constant(0.0), outputs
                losses = per_example(labels, outputs)
            # Padding (mask False) gets weight 0: counted nowhere.
            loss_sum = tf.reduce_sum(tf.where(mask, losses, 0.0))
            if self.metric != "accuracy":
                return loss_sum, outputs
            confusion = tf.math.confusion_matrix(
                tf.where(mask, true_classes(labels), 0),
                tf.argmax(outputs, -1, tf.int32),
                self.classes,
                weights=tf.cast(mask, tf.int64),
                dtype=tf.int64,
            )
            return loss_sum, confusion

        self.predict_batch = predict_batch

    def evaluate(self, weights, non_trainable=None) -> Evaluation:
        """`weights` on the test split, with the model's own non-trainable values (BatchNorm's
        moving statistics) unless `non_trainable` gives others (model.batch_norm_statistics)."""
        values = [tf.convert_to_tensor(w) for w in weights]
        state = [
            tf.convert_to_tensor(v)
            for v in (non_trainable or [v.value for v in self.non_trainable])
        ]
        loss = 0.0
        by_accuracy = self.metric == "accuracy"
        confusion = np.zeros((self.classes, self.classes) if by_accuracy else (0, 0), np.int64)
        kept_labels, kept_outputs = [], []
        for images, labels, mask in self.dataset:
            loss_sum, result = self.predict_batch(values, state, images, labels, mask)
            loss += float(loss_sum.numpy())
            if self.metric == "accuracy":
                confusion += result.numpy()
            else:
                kept_labels.append(labels.numpy()[mask.numpy()])
                kept_outputs.append(result.numpy()[mask.numpy()])
        if self.metric == "accuracy":
            examples = int(confusion.sum())
            return Evaluation(loss / max(examples, 1), accuracy(confusion), examples, confusion)
        labels_seen, outputs = np.concatenate(kept_labels), np.concatenate(kept_outputs)
        if self.recall_k is not None:
            ranked = retrieval(
                labels_seen, outputs, self.recall_k, self.eval_candidates, self.temperature
            )
            return Evaluation(ranked.loss, ranked.recall, len(outputs), None)
        value = VALUES[self.metric](labels_seen.reshape(outputs.shape), outputs)
        return Evaluation(loss / max(len(outputs), 1), value, len(outputs), None)
