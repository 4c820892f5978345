"""The tower step: k replicas of the network, one per device, and one optimizer step.

Variables live on the parameter device. Each step the global batch is split into k shards; tower
t computes, on its own device, the gradient of its shard's cross-entropy
    loss_t = sum(cross_entropy over shard t) / (B / k)
(the shard mean when shards are equal). The k gradients are combined on the parameter device:
    mean: (1/k) sum_t grad_t  = gradient of the global batch's mean loss (the tutorial, Horovod)
    sum:        sum_t grad_t  = k x that (tf.distribute without global-batch loss scaling).
Weight decay (weight_decay * w, the gradient of weight_decay * tf.nn.l2_loss(w)) and the model's
own weight regularizers (a user's kernel_regularizer) are added once, after combining (Goyal et
al. 2017, remark 1), and one optimizer step is applied. Losses the model adds while it runs
(activity regularizers) are per shard: each tower adds its own, so the towers' mean enters the
step, as `tf.nn.scale_regularization_loss` makes it under tf.distribute and as one device on the
whole batch computes it (Keras divides an activity regularizer by the batch). BatchNorm layers
normalise with each tower's own batch; their moving statistics (any floating-point state) become
the towers' average. Dropout draws its own masks in each tower: tower r's random state is offset
by r, and the state then advances as one tower's does.

With `lr_scaling: adascale` (model.adascale) the same two norms the noise scale uses set each
step's gain before the optimizer applies it, and its progress tau advances after.

With several workers (model.cluster) each worker feeds its towers its slice of the global batch
(B / workers examples) and one all-reduce adds the workers' summed gradients, statistics and
metric sums before the update, so the step is that of one process with workers x k towers.

The whole step is one `tf.function`: the Python loop over towers runs only while tracing. Metrics
accumulate in variables so the hot loop never waits for a host read.
"""

from __future__ import annotations

from typing import NamedTuple

import keras
import tensorflow as tf

from towerbench.model.adascale import AdaScale
from towerbench.model.cluster import STEP_INSTANCE_KEY, Cluster, sum_over_workers
from towerbench.model.devices import TowerDevices
from towerbench.model.networks import Network
from towerbench.model.noise_scale import NoiseScaleEstimator
from towerbench.model.precision import LossScale, Precision
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
    cross_entropy_sum: tf.Tensor  # summed over every example of the global batch
    correct: tf.Tensor  # correctly classified examples
    non_trainable_values: list[tf.Tensor]  # BatchNorm statistics averaged over all towers
    model_loss: tf.Tensor  # the model's own losses of the call (activity), mean over towers
    small_norm_sq: tf.Tensor  # mean over all towers of |grad_t|^2 (per-tower-batch gradient)
    big_norm_sq: tf.Tensor  # |mean_t grad_t|^2 (global-batch gradient)


def _squared_norm(tensors: list[tf.Tensor]) -> tf.Tensor:
    return tf.add_n([tf.reduce_sum(tf.square(tensor)) for tensor in tensors])


class TowerTrainer:
    """Owns the tower step of one network on a set of tower devices."""

    def __init__(
        self,
        network: Network,
        optimizer: keras.optimizers.Optimizer,
        devices: TowerDevices,
        aggregation: str = "mean",
        weight_decay: float = 0.0,
        ema_decay: float | None = None,
        jit_compile: bool = False,
        cluster: Cluster | None = None,
        precision: Precision = "float32",
        adascale: AdaScale | None = None,
    ):
        if aggregation not in ("mean", "sum"):
            raise ValueError(f"aggregation must be mean or sum, got {aggregation!r}")
        self.model = network.model
        self.optimizer = optimizer
        self.devices = devices
        self.aggregation = aggregation
        self.weight_decay = weight_decay
        self.ema_decay = ema_decay
        self.cluster = cluster or Cluster()
        self.adascale = adascale  # its schedule is the optimizer's: built with it, by the caller
        self.trainable = list(self.model.trainable_variables)
        self.non_trainable = list(self.model.non_trainable_variables)
        # Floating-point state (BatchNorm's moving statistics) is averaged over the towers; the
        # rest (random states, counters) is taken from the first tower.
        self.averaged = [tf.as_dtype(v.dtype).is_floating for v in self.non_trainable]
        self.seed_offsets = [
            tf.constant([SEED_STRIDE, 0], tf.as_dtype(v.dtype)) if v.name == SEED_STATE else None
            for v in self.non_trainable
        ]
        self.regularizers = [getattr(v, "regularizer", None) for v in self.trainable]
        decayed = {id(variable) for variable in network.decayed_variables}
        self.decayed_mask = [id(variable) in decayed for variable in self.trainable]
        with tf.device(devices.parameter_device):
            self.optimizer.build(self.trainable)
            # The tutorial's EMA of the weights, evaluated alongside the raw weights.
            self.ema_weights = [
                tf.Variable(variable.value, trainable=False, name="ema")
                for variable in self.trainable
            ]
            self.noise = NoiseScaleEstimator()
            self.loss_scale = LossScale(precision)
            self.cross_entropy_sum = tf.Variable(0.0, trainable=False, dtype=tf.float64)
            self.correct = tf.Variable(0, trainable=False, dtype=tf.int64)
            self.examples = tf.Variable(0, trainable=False, dtype=tf.int64)
            self.last_loss = tf.Variable(0.0, trainable=False)
            self.last_cross_entropy = tf.Variable(0.0, trainable=False)
            self.weight_decay_loss = tf.Variable(0.0, trainable=False)
        # XLA compiles each tower's forward and backward pass (one cluster per device). No
        # AutoGraph: the step's control flow is all Python, and converting it would add about
        # a second to every training process's first step.
        self._tower = (
            tf.function(self._tower_pass, jit_compile=True, autograph=False)
            if jit_compile
            else self._tower_pass
        )
        self.step = tf.function(self._step, autograph=False)
        self.gradients = tf.function(self._gradients, autograph=False)

    @property
    def towers(self) -> int:
        """Towers of this worker."""
        return len(self.devices.devices)

    @property
    def replicas(self) -> int:
        """Towers of all workers."""
        return self.towers * self.cluster.workers

    def _tower_pass(self, weights, non_trainable, images, labels, normalizer, scale):
        """One tower: forward, cross-entropy, backward. Shapes: images (b, H, W, C), labels (b,).
        The gradients are of the loss times `scale` (float16's loss scale, else 1)."""
        with tf.GradientTape() as tape:
            tape.watch(weights)
            logits, new_non_trainable, losses = self.model.stateless_call(
                weights, non_trainable, images, training=True, return_losses=True
            )
            # Keras lists the weight regularizers last; they are added once per step instead.
            regularized = sum(r is not None for r in self.regularizers)
            call_losses = [tf.cast(x, tf.float32) for x in losses[: len(losses) - regularized]]
            model_loss = tf.add_n(call_losses) if call_losses else tf.constant(0.0)
            cross_entropy = tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
            loss = tf.reduce_sum(cross_entropy) / normalizer + model_loss
            scaled = loss * scale if self.loss_scale.dynamic else loss
        gradients = tape.gradient(scaled, weights)
        hits = tf.equal(tf.argmax(logits, -1, tf.int32), labels)
        correct = tf.reduce_sum(tf.cast(hits, tf.int64))
        return gradients, tf.reduce_sum(cross_entropy), correct, new_non_trainable, model_loss

    def _tower_state(self, non_trainable: list[tf.Tensor], replica: int) -> list[tf.Tensor]:
        """The state tower `replica` (over all workers) starts from: its own random state."""
        if replica == 0:
            return non_trainable
        return [
            value if offset is None else value + replica * offset
            for value, offset in zip(non_trainable, self.seed_offsets, strict=True)
        ]

    def _gradients(self, images: tf.Tensor, labels: tf.Tensor) -> TowerGradients:
        """Every tower's gradient of its shard, combined on the parameter device (and over the
        workers, whose images and labels are each their slice of the global batch)."""
        with tf.device(self.devices.parameter_device):
            # Read each variable once; every tower consumes the same tensor.
            weights = [tf.convert_to_tensor(v.value) for v in self.trainable]
            non_trainable = [tf.convert_to_tensor(v.value) for v in self.non_trainable]
            # float16 only: the other precisions read no scale on the hot path.
            scale = tf.convert_to_tensor(self.loss_scale.scale) if self.loss_scale.dynamic else None
        first_replica = self.cluster.index * self.towers
        results = self._every_tower(weights, non_trainable, images, labels, scale, first_replica)
        tower_gradients, tower_losses, tower_correct, tower_states, tower_model_losses = zip(
            *results, strict=True
        )
        with tf.device(self.devices.parameter_device):
            summed = [tf.add_n(list(grads)) for grads in zip(*tower_gradients, strict=True)]
            states = list(zip(*tower_states, strict=True))
            state_sums = [
                tf.add_n(list(values))
                for values, averaged in zip(states, self.averaged, strict=True)
                if averaged
            ]
            cross_entropy_sum = tf.add_n(list(tower_losses))
            model_loss_sum = tf.add_n(list(tower_model_losses))
            correct = tf.add_n(list(tower_correct))
            small_sum = tf.add_n([_squared_norm(list(g)) for g in tower_gradients])
            if scale is not None:  # dynamic loss scaling; exact: the scale is a power of 2
                summed = [gradient / scale for gradient in summed]
                small_sum = small_sum / (scale * scale)
            if self.cluster.workers > 1:
                reduced = sum_over_workers(
                    [*summed, *state_sums, cross_entropy_sum, model_loss_sum, correct, small_sum],
                    self.cluster,
                    STEP_INSTANCE_KEY,
                )
                summed, state_sums = reduced[: len(summed)], reduced[len(summed) : -4]
                cross_entropy_sum, model_loss_sum, correct, small_sum = reduced[-4:]
            mean = summed if self.replicas == 1 else [g / self.replicas for g in summed]
            if self.replicas > 1:
                small, big = small_sum / self.replicas, _squared_norm(mean)
            else:
                small = big = tf.constant(0.0)
            return TowerGradients(
                data_gradients=mean if self.aggregation == "mean" else summed,
                cross_entropy_sum=cross_entropy_sum,
                correct=correct,
                non_trainable_values=self._new_state(states, state_sums, first_replica),
                model_loss=model_loss_sum / self.replicas,
                small_norm_sq=small,
                big_norm_sq=big,
            )

    def _every_tower(self, weights, non_trainable, images, labels, scale, first_replica: int):
        """Each tower's pass (`_tower_pass`'s results) over its shard of the batch, on its own
        device, from its own random state."""
        batch = int(images.shape[0])
        sizes = shard_sizes(batch, self.towers)
        normalizer = tf.constant(batch / self.towers, tf.float32)
        results = []
        for tower, (device, shard_images, shard_labels) in enumerate(
            zip(self.devices.devices, tf.split(images, sizes), tf.split(labels, sizes), strict=True)
        ):
            state = self._tower_state(non_trainable, first_replica + tower)
            with tf.device(device):
                results.append(
                    self._tower(weights, state, shard_images, shard_labels, normalizer, scale)
                )
        return results

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

    def weight_decay_terms(self) -> tuple[tf.Tensor, list[tf.Tensor | None]]:
        """(weight_decay * sum of tf.nn.l2_loss(w) + the model's weight regularizers, its
        gradient per variable): weight_decay * w plus each regularizer's gradient."""
        terms: list[tf.Tensor | None] = []
        l2_losses = [tf.constant(0.0)]
        for variable, decayed in zip(self.trainable, self.decayed_mask, strict=True):
            terms.append(self.weight_decay * variable.value if decayed else None)
            if decayed:
                l2_losses.append(tf.nn.l2_loss(variable.value))
        decay = self.weight_decay * tf.add_n(l2_losses)
        if not any(r is not None for r in self.regularizers):
            return decay, terms
        values = [variable.value for variable in self.trainable]
        with tf.GradientTape() as tape:
            tape.watch(values)
            regularization = tf.add_n(
                [
                    tf.cast(regularizer(value), tf.float32)
                    for value, regularizer in zip(values, self.regularizers, strict=True)
                    if regularizer is not None
                ]
            )
        gradients = tape.gradient(regularization, values)
        for index, gradient in enumerate(gradients):
            if self.regularizers[index] is not None:
                terms[index] = gradient if terms[index] is None else terms[index] + gradient
        return decay + regularization, terms

    def _step(self, images: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        """One training step on a global batch (this worker's slice of it); returns the step's
        total loss."""
        local_batch = int(images.shape[0])
        batch = local_batch * self.cluster.workers
        combined = self._gradients(images, labels)
        with tf.device(self.devices.parameter_device):
            decay_loss, decay_gradients = self.weight_decay_terms()
            gradients = [
                gradient if extra is None else gradient + extra
                for gradient, extra in zip(combined.data_gradients, decay_gradients, strict=True)
            ]
            if self.adascale is not None:  # the LR of this step is lr(tau) * gain
                self.adascale.update(combined.small_norm_sq, combined.big_norm_sq, batch)
            self.loss_scale.apply(self.optimizer, gradients, self.trainable)
            if self.adascale is not None:
                self.adascale.advance()
            for variable, value in zip(
                self.non_trainable, combined.non_trainable_values, strict=True
            ):
                variable.assign(value)
            if self.ema_decay is not None:
                self._update_ema()
            if self.replicas > 1 and local_batch % self.towers == 0:
                self.noise.update(
                    combined.small_norm_sq, combined.big_norm_sq, local_batch // self.towers, batch
                )
            cross_entropy = combined.cross_entropy_sum / batch
            decay_loss = decay_loss + combined.model_loss
            total = cross_entropy + decay_loss
            self.cross_entropy_sum.assign_add(tf.cast(combined.cross_entropy_sum, tf.float64))
            self.correct.assign_add(combined.correct)
            self.examples.assign_add(batch)
            self.weight_decay_loss.assign(decay_loss)
            self.last_loss.assign(total)
            self.last_cross_entropy.assign(cross_entropy)
            return total

    def _update_ema(self) -> None:
        # tf.train.ExponentialMovingAverage with num_updates: early steps average faster.
        steps = tf.cast(self.optimizer.iterations, tf.float32)
        decay = tf.minimum(self.ema_decay, (1.0 + steps) / (10.0 + steps))
        for average, variable in zip(self.ema_weights, self.trainable, strict=True):
            average.assign_sub((1.0 - decay) * (average - variable.value))

    def reset_metrics(self) -> None:
        for accumulator in (self.cross_entropy_sum, self.correct, self.examples):
            accumulator.assign(tf.zeros_like(accumulator))

    def read_metrics(self) -> dict[str, float]:
        """Mean cross-entropy and accuracy since the last reset, the last step's weight decay."""
        examples = max(int(self.examples.numpy()), 1)
        cross_entropy = float(self.cross_entropy_sum.numpy()) / examples
        decay_loss = float(self.weight_decay_loss.numpy())
        return {
            "cross_entropy": cross_entropy,
            "weight_decay_loss": decay_loss,
            "total_loss": cross_entropy + decay_loss,
            "train_accuracy": float(self.correct.numpy()) / examples,
        }
