"""What a Keras optimizer wrapper needs to measure the replicas' gradients inside `fit` under a
`tf.distribute` strategy (AdaScale's gain, the gradient noise scale), like Keras' own
`LossScaleOptimizer` wraps an optimizer.

Under `fit` each replica's gradient reaches `apply` unsummed, as 1/R of its local mean (Keras
scales each replica's loss by 1/R); the inner optimizer would sum them. The wrapper sums them
itself, together with their squared norms, in one all-reduce, measures, and hands the inner
optimizer the sum on the first replica and zeros on the others, so its own sum is exact: two
all-reduces of the gradients a step where plain `fit` makes one. A wrapper around another
(NoiseScale's around AdaScale) hands it the replicas' own gradients, for it to measure too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import keras
import tensorflow as tf


@dataclass(frozen=True)
class ReplicaGradients:
    """One step's squared norms, as the trainer's towers give them (model/towers.py): `small`
    the mean over the R replicas of |g_t|^2, each g_t the mean gradient of its B/R examples,
    `big` |mean_t g_t|^2; and the gradients to hand the inner optimizer."""

    small_norm_sq: tf.Tensor
    big_norm_sq: tf.Tensor
    for_inner: list[Any]


def _norm_sq(tensors: list[tf.Tensor]) -> tf.Tensor:
    return tf.add_n([tf.reduce_sum(tf.square(tf.cast(t, tf.float32))) for t in tensors])


def replica_gradients(grads: list[Any], replica: tf.distribute.ReplicaContext) -> ReplicaGradients:
    """This replica's `grads` summed over the replicas, with both norms (one all-reduce).
    Sparse gradients (an Embedding's IndexedSlices) are made dense: correct, but a large
    vocabulary's table is then summed whole."""
    replicas = replica.num_replicas_in_sync
    present = [tf.convert_to_tensor(g) for g in grads if g is not None]
    reduced = replica.all_reduce(
        tf.distribute.ReduceOp.SUM, {"gradients": present, "norm_sq": _norm_sq(present)}
    )
    summed = reduced["gradients"]
    first = tf.equal(replica.replica_id_in_sync_group, 0)
    kept = iter(summed)
    return ReplicaGradients(
        # g_t = R x this replica's gradient: the mean of |g_t|^2 is R x the sum of theirs.
        small_norm_sq=replicas * reduced["norm_sq"],
        big_norm_sq=_norm_sq(summed),
        for_inner=[
            None if g is None else tf.where(first, next(kept), tf.zeros_like(g)) for g in grads
        ],
    )


def measures_inside(optimizer: keras.optimizers.Optimizer) -> bool:
    """Whether `optimizer` or one it wraps (`inner_optimizer`, as Keras' LossScaleOptimizer)
    measures the replicas' gradients itself: it must be handed them unsummed."""
    while optimizer is not None:
        if isinstance(optimizer, MeasuringWrapper):
            return True
        optimizer = getattr(optimizer, "inner_optimizer", None)
    return False


class MeasuringWrapper(keras.optimizers.Optimizer):
    """An optimizer that measures the replicas' gradients each step, then lets
    `inner_optimizer` apply them. Subclasses make their state in `build_state(replicas)` (with
    `new_variable`, so it is saved with the optimizer) and use it in `measured`, `alone` (one
    replica: nothing to measure) and `applied` (after the update)."""

    def __init__(self, inner_optimizer: keras.optimizers.Optimizer, name: str):
        if getattr(inner_optimizer, "gradient_accumulation_steps", None):
            raise ValueError(
                f"{type(self).__name__}: the inner optimizer accumulates gradients "
                "(gradient_accumulation_steps); it needs one update per step"
            )
        super().__init__(learning_rate=0.0, name=name)
        self.inner_optimizer = inner_optimizer

    def build_state(self, replicas: int) -> None:
        raise NotImplementedError

    def measured(self, gradients: ReplicaGradients) -> None:
        raise NotImplementedError

    def alone(self) -> None:
        """One replica: nothing to measure."""

    def applied(self) -> None:
        """After the inner optimizer's update."""

    def build(self, var_list):
        if self.built:  # fit builds it before the first step; a second build would reset it
            return
        self.build_state(tf.distribute.get_strategy().num_replicas_in_sync)
        self.inner_optimizer.build(var_list)
        super().build(var_list)

    def new_variable(self, name: str, value: float, dtype: tf.DType) -> keras.Variable:
        """A state variable of the wrapper's, one value whatever the replica."""
        return self.add_variable(
            shape=(),
            dtype=dtype.name,
            initializer=keras.initializers.Constant(value),
            aggregation="only_first_replica",
            name=name,
        )

    def apply(self, grads, trainable_variables=None):
        if not self.built:
            with keras.name_scope(self.name, caller=self):
                self.build(trainable_variables)
            self.built = True
        replica = tf.distribute.get_replica_context()
        if all(g is None for g in grads):
            return  # nothing to apply, as Keras' own optimizers
        if replica is not None and replica.num_replicas_in_sync > 1:
            gradients = replica_gradients(list(grads), replica)
            self.measured(gradients)
            if not measures_inside(self.inner_optimizer):  # else it measures its own too
                grads = gradients.for_inner
        else:
            self.alone()
        self.inner_optimizer.apply(grads, trainable_variables)
        self.applied()

    @property
    def variables(self):
        return self._variables + self.inner_optimizer.variables

    @property
    def learning_rate(self):
        return self.inner_optimizer.learning_rate

    @learning_rate.setter
    def learning_rate(self, learning_rate):
        self.inner_optimizer.learning_rate = learning_rate

    @property
    def iterations(self):
        return self.inner_optimizer.iterations

    def finalize_variable_values(self, var_list):
        self.inner_optimizer.finalize_variable_values(var_list)
