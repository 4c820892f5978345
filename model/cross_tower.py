"""Every tower's candidates for a loss over the batch (`train.cross_tower: gather`).

in_batch_softmax scores each query against the candidates of its batch, so a tower on its own
B/k examples computes another, easier loss than one device on the batch. Gathered, each tower
sees the batch's B candidates: a first forward pass gives every tower's outputs, which are
concatenated in the global batch's order (over the workers too, by one all-reduce of each
worker's outputs placed in its own slice). Each tower then computes the loss of *every* query
of the batch with its own slice of the outputs live and the others constant, so its gradient is
its own examples' share of the batch loss's gradient: the towers' sum is exactly that gradient,
and towers averaged as usual train what one device on the batch trains. Labels (candidate ids)
travel with the outputs, so accidental hits are masked in the gathered order too.
"""

from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf

from towerbench.model.cluster import GATHER_INSTANCE_KEY, Cluster, sum_over_workers


class Gathered(NamedTuple):
    """The batch's outputs and labels, and where one tower's own examples lie in them."""

    outputs: tf.Tensor  # (B, 2, d) every tower's of every worker, in the global batch's order
    labels: tf.Tensor  # (B,) their candidate ids
    start: int  # the tower's first example


def with_own(gathered: Gathered, outputs: tf.Tensor) -> tf.Tensor:
    """The gathered outputs with the tower's own slice replaced by its live `outputs` (the
    gradient flows through them) and every other tower's held constant."""
    end = gathered.start + int(outputs.shape[0])
    before = tf.stop_gradient(gathered.outputs[: gathered.start])
    after = tf.stop_gradient(gathered.outputs[end:])
    return tf.concat([before, tf.cast(outputs, gathered.outputs.dtype), after], 0)


def over_workers(outputs: tf.Tensor, labels: tf.Tensor, cluster: Cluster) -> tuple:
    """This worker's outputs and labels, its slice of the batch, as every worker's: each
    worker places its own in its slice of zeros and one all-reduce adds them (exactly)."""
    if cluster.workers == 1:
        return outputs, labels
    size, rank = int(outputs.shape[0]), len(outputs.shape)
    slot = [[cluster.index * size, (cluster.workers - 1 - cluster.index) * size]]
    placed = [
        tf.pad(outputs, slot + [[0, 0]] * (rank - 1)),
        tf.pad(tf.cast(labels, tf.float64), slot),
    ]
    # float64 on the wire: the outputs and any id below 2**53 arrive exactly.
    every_output, every_label = sum_over_workers(placed, cluster, GATHER_INSTANCE_KEY, tf.float64)
    return every_output, tf.cast(tf.round(every_label), labels.dtype)
