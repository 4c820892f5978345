"""The towers' gradient: k replicas of the network, one per device, each on its shard of the batch.

Each step the global batch is split into k shards; tower t computes, on its own device, the
gradient of its shard's loss (train.loss, per example: model.losses; the cross-entropy by default)
    loss_t = sum(loss over shard t) / (B / k)
(the shard mean when shards are equal). The k gradients are combined on the parameter device:
    mean: (1/k) sum_t grad_t  = gradient of the global batch's mean loss (the tutorial, Horovod)
    sum:        sum_t grad_t  = k x that (tf.distribute without global-batch loss scaling).
Losses the model adds while it runs (activity regularizers) are per shard: each tower adds its
own, so the towers' mean enters the step, as `tf.nn.scale_regularization_loss` makes it under
tf.distribute and as one device on the whole batch computes it (Keras divides an activity
regularizer by the batch). The model's weight regularizers are left to the step (model.
weight_decay). BatchNorm layers normalise with each tower's own batch; their moving statistics
(any floating-point state) become the towers' average. Dropout draws its own masks in each
tower: tower r's random state is offset by r, and the state then advances as one tower's does.

With several workers (model.cluster) each worker feeds its towers its slice of the global batch
(B / workers examples) and one all-reduce adds the workers' sums (`TowerSums`) before the
update, so the gradient is that of one process with workers x k towers.
"""

from __future__ import annotations

from typing import NamedTuple

import keras
import tensorflow as tf

from towerbench.config.losses import judged_by_accuracy
from towerbench.core.tfrecord_format import LabelKind
from towerbench.model.cluster import STEP_INSTANCE_KEY, Cluster, sum_over_workers
from towerbench.model.cross_tower import Gathered, over_workers, with_own
from towerbench.model.devices import TowerDevices
from towerbench.model.losses import PerExampleLoss, per_example_loss, true_classes
from towerbench.model.precision import LossScale
from towerbench.model.user_model import SEED_STATE

SEED_STRIDE = 1_000_003  # replica r draws with seed (s + r * SEED_STRIDE, counter)


def shard_sizes(batch: int, towers: int) -> list[int]:
    """Split `batch` examples over `towers` as evenly as possible (first shards get the extra)."""
    if batch < towers:
        raise ValueError(f"a batch of {batch} cannot feed {towers} towers")
    base, extra = divmod(batch, towers)
    return [base + 1 if index < extra else base for index in range(towers)]


class TowerGradients(NamedTuple):
    """One step's combined gradients and what the metrics need."""

    data_gradients: list[tf.Tensor]  # combined with `aggregation`, no weight decay
    cross_entropy_sum: tf.Tensor  # the loss (train.loss) summed over the global batch
    correct: tf.Tensor  # correctly classified examples (0 for a loss without classes)
    non_trainable_values: list[tf.Tensor]  # BatchNorm statistics averaged over all towers
    model_loss: tf.Tensor  # the model's own losses of the call (activity), mean over towers
    small_norm_sq: tf.Tensor  # mean over all towers of |grad_t|^2 (per-tower-batch gradient)
    big_norm_sq: tf.Tensor  # |mean_t grad_t|^2 (global-batch gradient)


class TowerSums(NamedTuple):
    """What the towers of a worker add up, and the workers then sum in one all-reduce."""

    gradients: list[tf.Tensor]
    state_sums: list[tf.Tensor]  # of the averaged (floating-point) state
    cross_entropy_sum: tf.Tensor
    model_loss_sum: tf.Tensor
    correct: tf.Tensor
    small_norm_sq_sum: tf.Tensor  # sum over towers of |grad_t|^2


def _squared_norm(tensors: list[tf.Tensor]) -> tf.Tensor:
    return tf.add_n([tf.reduce_sum(tf.square(tensor)) for tensor in tensors])


class TowerGradientFunction:
    """`(images, labels) -> TowerGradients` of one network over a set of tower devices."""

    def __init__(
        self,
        model: keras.Model,
        devices: TowerDevices,
        aggregation: str,
        loss_scale: LossScale,
        cluster: Cluster,
        jit_compile: bool = False,
        loss: str = "sparse_categorical_crossentropy",
        temperature: float = 1.0,
        cross_tower: str = "local",
    ):
        if aggregation not in ("mean", "sum"):
            raise ValueError(f"aggregation must be mean or sum, got {aggregation!r}")
        self.model = model
        self.devices = devices
        self.aggregation = aggregation
        self.loss_scale = loss_scale
        self.cluster = cluster
        self.loss: PerExampleLoss = per_example_loss(loss, temperature)
        self.loss_name = loss
        self.gather = cross_tower == "gather"  # model.cross_tower
        self.trainable = list(model.trainable_variables)
        self.non_trainable = list(model.non_trainable_variables)
        # Floating-point state (BatchNorm's moving statistics) is averaged over the towers; the
        # rest (random states, counters) is taken from the first tower.
        self.averaged = [tf.as_dtype(v.dtype).is_floating for v in self.non_trainable]
        self.seed_offsets = [
            tf.constant([SEED_STRIDE, 0], tf.as_dtype(v.dtype)) if v.name == SEED_STATE else None
            for v in self.non_trainable
        ]
        # Keras lists the weight regularizers last among a call's losses; the step adds them.
        self.regularized = sum(getattr(v, "regularizer", None) is not None for v in self.trainable)
        # XLA compiles each tower's forward and backward pass (one cluster per device). No
        # AutoGraph: the control flow is all Python.
        self._tower = (
            tf.function(self._tower_pass, jit_compile=True, autograph=False)
            if jit_compile
            else self._tower_pass
        )

    @property
    def towers(self) -> int:
        """Towers of this worker."""
        return len(self.devices.devices)

    @property
    def replicas(self) -> int:
        """Towers of all workers."""
        return self.towers * self.cluster.workers

    def _tower_pass(self, weights, non_trainable, images, labels, normalizer, scale, gathered):
        """One tower: forward, loss, backward. Shapes: images (b, H, W, C), labels (b,) class
        ids or (b, columns) rows. The gradients are of the loss times `scale` (float16's loss
        scale, else 1). With `gathered` (model.cross_tower) the loss is every query's of the
        batch, through the tower's own outputs; what it reports is its own examples'."""
        with tf.GradientTape() as tape:
            tape.watch(weights)
            logits, new_non_trainable, losses = self.model.stateless_call(
                weights, non_trainable, images, training=True, return_losses=True
            )
            call_losses = [tf.cast(x, tf.float32) for x in losses[: len(losses) - self.regularized]]
            model_loss = tf.add_n(call_losses) if call_losses else tf.constant(0.0)
            if gathered is None:
                objective = per_example = self.loss(labels, logits)
            else:
                objective = self.loss(gathered.labels, with_own(gathered, logits))
                per_example = objective[gathered.start : gathered.start + int(images.shape[0])]
            loss = tf.reduce_sum(objective) / normalizer + model_loss
            scaled = loss * scale if self.loss_scale.dynamic else loss
        gradients = tape.gradient(scaled, weights)
        return (
            gradients,
            tf.reduce_sum(per_example),
            self._correct(labels, logits),
            new_non_trainable,
            model_loss,
        )

    def _correct(self, labels: tf.Tensor, logits: tf.Tensor) -> tf.Tensor:
        """Examples whose largest logit is their class (0 for a loss without one class each)."""
        held: LabelKind = "class_ids" if labels.shape.rank == 1 else "rows"
        if not judged_by_accuracy(self.loss_name, held):
            return tf.constant(0, tf.int64)
        hits = tf.equal(tf.argmax(logits, -1, tf.int32), true_classes(labels))
        return tf.reduce_sum(tf.cast(hits, tf.int64))

    def _tower_state(self, non_trainable: list[tf.Tensor], replica: int) -> list[tf.Tensor]:
        """The state tower `replica` (over all workers) starts from: its own random state."""
        if replica == 0:
            return non_trainable
        return [
            value if offset is None else value + replica * offset
            for value, offset in zip(non_trainable, self.seed_offsets, strict=True)
        ]

    def __call__(self, images: tf.Tensor, labels: tf.Tensor) -> TowerGradients:
        """Every tower's gradient of its shard, combined on the parameter device (and over the
        workers, whose images and labels are each their slice of the global batch)."""
        with tf.device(self.devices.parameter_device):
            # Read each variable once; every tower consumes the same tensor.
            weights = [tf.convert_to_tensor(v.value) for v in self.trainable]
            non_trainable = [tf.convert_to_tensor(v.value) for v in self.non_trainable]
            # float16 only: the other precisions read no scale on the hot path.
            scale = tf.convert_to_tensor(self.loss_scale.scale) if self.loss_scale.dynamic else None
        first_replica = self.cluster.index * self.towers
        gathered = (
            self._gathered(weights, non_trainable, images, labels, first_replica)
            if self.gather
            else [None] * self.towers
        )
        results = self._every_tower(weights, non_trainable, images, labels, scale, gathered)
        with tf.device(self.devices.parameter_device):
            sums, states = self._tower_sums(results, scale)
            if self.cluster.workers > 1:
                sums = tf.nest.pack_sequence_as(
                    sums,
                    sum_over_workers(tf.nest.flatten(sums), self.cluster, STEP_INSTANCE_KEY),
                )
            return self._combined(sums, states, first_replica)

    def _tower_sums(self, results, scale) -> tuple[TowerSums, list[tuple]]:
        """This worker's towers added up (the gradients unscaled), and each state variable's
        values per tower."""
        tower_gradients, tower_losses, tower_correct, tower_states, tower_model_losses = zip(
            *results, strict=True
        )
        summed = [tf.add_n(list(grads)) for grads in zip(*tower_gradients, strict=True)]
        states = list(zip(*tower_states, strict=True))
        small_sum = tf.add_n([_squared_norm(list(g)) for g in tower_gradients])
        if scale is not None:  # dynamic loss scaling; exact: the scale is a power of 2
            summed = [gradient / scale for gradient in summed]
            small_sum = small_sum / (scale * scale)
        sums = TowerSums(
            gradients=summed,
            state_sums=[
                tf.add_n(list(values))
                for values, averaged in zip(states, self.averaged, strict=True)
                if averaged
            ],
            cross_entropy_sum=tf.add_n(list(tower_losses)),
            model_loss_sum=tf.add_n(list(tower_model_losses)),
            correct=tf.add_n(list(tower_correct)),
            small_norm_sq_sum=small_sum,
        )
        return sums, states

    def _combined(self, sums: TowerSums, states: list[tuple], first_replica: int) -> TowerGradients:
        """All replicas' sums as the step uses them: the aggregated gradient and both norms."""
        summed = sums.gradients
        mean = summed if self.replicas == 1 else [g / self.replicas for g in summed]
        if self.replicas > 1:
            small, big = sums.small_norm_sq_sum / self.replicas, _squared_norm(mean)
        else:
            small = big = tf.constant(0.0)
        return TowerGradients(
            data_gradients=mean if self.aggregation == "mean" else summed,
            cross_entropy_sum=sums.cross_entropy_sum,
            correct=sums.correct,
            non_trainable_values=self._new_state(states, sums.state_sums, first_replica),
            model_loss=sums.model_loss_sum / self.replicas,
            small_norm_sq=small,
            big_norm_sq=big,
        )

    def _every_tower(self, weights, non_trainable, images, labels, scale, gathered: list):
        """Each tower's pass (`_tower_pass`'s results) over its shard of the batch, on its own
        device, from its own random state, with its `gathered` batch or None."""
        batch = int(images.shape[0])
        sizes = shard_sizes(batch, self.towers)
        normalizer = tf.constant(batch / self.towers, tf.float32)
        first_replica = self.cluster.index * self.towers
        results = []
        for tower, (device, shard_images, shard_labels, batch_seen) in enumerate(
            zip(
                self.devices.devices,
                tf.split(images, sizes),
                tf.split(labels, sizes),
                gathered,
                strict=True,
            )
        ):
            state = self._tower_state(non_trainable, first_replica + tower)
            with tf.device(device):
                results.append(
                    self._tower(
                        weights, state, shard_images, shard_labels, normalizer, scale, batch_seen
                    )
                )
        return results

    def _gathered(self, weights, non_trainable, images, labels, first_replica: int) -> list:
        """Each tower's view of the whole batch (model.cross_tower): a first forward pass of
        every tower from the random state its training pass starts from, so the outputs are
        the same, gathered over the towers and the workers."""
        sizes = shard_sizes(int(images.shape[0]), self.towers)
        outputs = []
        for tower, (device, shard_images) in enumerate(
            zip(self.devices.devices, tf.split(images, sizes), strict=True)
        ):
            state = self._tower_state(non_trainable, first_replica + tower)
            with tf.device(device):
                tower_outputs, _ = self.model.stateless_call(
                    weights, state, shard_images, training=True
                )
                outputs.append(tf.cast(tower_outputs, tf.float32))
        with tf.device(self.devices.parameter_device):
            batch_outputs, batch_labels = over_workers(tf.concat(outputs, 0), labels, self.cluster)
        start = self.cluster.index * int(images.shape[0])
        starts = [start + sum(sizes[:tower]) for tower in range(self.towers)]
        return [Gathered(batch_outputs, batch_labels, first) for first in starts]

    def _new_state(self, states, state_sums: list[tf.Tensor], first_replica: int):
        """Each state variable's value after the step: the towers' mean of floating-point
        state, the first tower's (its random-state offset removed) of the rest."""
        sums = iter(state_sums)
        values = []
        for values_per_tower, averaged, offset in zip(
            states, self.averaged, self.seed_offsets, strict=True
        ):
            if averaged:
                values.append(next(sums) / self.replicas)
            elif offset is not None and first_replica:
                values.append(values_per_tower[0] - first_replica * offset)
            else:
                values.append(values_per_tower[0])
        return values
