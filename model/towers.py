"""The tower step: the towers' combined gradient (model.tower_gradients) and one optimizer step,
made of small parts in this order:

1. `TowerGradientFunction`: each tower's gradient of its shard, combined (mean or sum) on the
   parameter device and over the workers, with the squared norms the noise scale needs;
2. `WeightDecay`: weight_decay x w and the model's weight regularizers, added once;
3. `AdaScale` (lr_scaling adascale, model.adascale): this step's gain from the two norms;
4. `LossScale` (model.precision): the optimizer's update, skipped when float16 overflowed;
5. AdaScale's progress tau advances by the gain;
6. the non-trainable state (BatchNorm's statistics) takes the towers' average;
7. `WeightAverage`: the weights' EMA;
8. `NoiseScaleEstimator` (model.noise_scale): the gradient noise scale's averages;
9. `StepMetrics`: the losses, the accuracy and the LR the step used, in variables.
AdaScale, its schedule and the noise-scale estimator are the objects towerbench.keras wraps.

The whole step is one `tf.function`: the Python loop over towers runs only while tracing.
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from towerbench.config.sections import TrainConfig
from towerbench.core.tfrecord_format import Manifest
from towerbench.model.adascale import AdaScale, AdaScaleState
from towerbench.model.batch_norm_statistics import scale_batch_norm_momentum
from towerbench.model.cluster import Cluster
from towerbench.model.devices import TowerDevices
from towerbench.model.input_pipeline import network_input_shape
from towerbench.model.networks import Network, build_network
from towerbench.model.noise_scale import NoiseScaleEstimator
from towerbench.model.optimizers import build_optimizer, check_weight_decay_once
from towerbench.model.precision import LossScale, Precision
from towerbench.model.step_metrics import StepMetrics
from towerbench.model.tower_gradients import TowerGradientFunction, TowerGradients
from towerbench.model.weight_average import WeightAverage
from towerbench.model.weight_decay import WeightDecay


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
        loss: str = "sparse_categorical_crossentropy",
        temperature: float = 1.0,
        cross_tower: str = "local",
    ):
        self.model = network.model
        self.optimizer = optimizer
        self.devices = devices
        self.cluster = cluster or Cluster()
        self.adascale = adascale  # its schedule is the optimizer's: built with it, by the caller
        self.trainable = list(self.model.trainable_variables)
        self.non_trainable = list(self.model.non_trainable_variables)
        self.weight_decay = WeightDecay(network, weight_decay)
        with tf.device(devices.parameter_device):
            self.optimizer.build(self.trainable)
            self.weight_average = WeightAverage(self.trainable, ema_decay)
            self.noise = NoiseScaleEstimator()
            self.loss_scale = LossScale(precision)
            self.metrics = StepMetrics()
        self.tower_gradients = TowerGradientFunction(
            self.model,
            devices,
            aggregation,
            self.loss_scale,
            self.cluster,
            jit_compile,
            loss,
            temperature,
            cross_tower,
        )
        # No AutoGraph: the step's control flow is all Python, and converting it would add
        # about a second to every training process's first step.
        self.step = tf.function(self._step, autograph=False)
        self.gradients = tf.function(self.tower_gradients, autograph=False)

    @property
    def towers(self) -> int:
        """Towers of this worker."""
        return self.tower_gradients.towers

    @property
    def replicas(self) -> int:
        """Towers of all workers."""
        return self.tower_gradients.replicas

    @property
    def ema_weights(self) -> list[tf.Variable]:
        """The weights' moving average (the initial weights when the run keeps none)."""
        return self.weight_average.weights

    def _step(self, images: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        """One training step on a global batch (this worker's slice of it); returns the step's
        total loss."""
        local_batch = int(images.shape[0])
        batch = local_batch * self.cluster.workers
        combined = self.tower_gradients(images, labels)
        with tf.device(self.devices.parameter_device):
            decay_loss, decay_gradients = self.weight_decay.terms()
            gradients = [
                gradient if extra is None else gradient + extra
                for gradient, extra in zip(combined.data_gradients, decay_gradients, strict=True)
            ]
            if self.adascale is not None:  # the LR of this step is lr(tau) * gain
                self.adascale.update(combined.small_norm_sq, combined.big_norm_sq, batch)
            lr = self.optimizer.learning_rate  # as the update uses it: before it counts the step
            self.loss_scale.apply(self.optimizer, gradients, self.trainable)
            if self.adascale is not None:
                self.adascale.advance()
            for variable, value in zip(
                self.non_trainable, combined.non_trainable_values, strict=True
            ):
                variable.assign(value)
            self.weight_average.update(self.optimizer.iterations)
            self._update_noise(combined, local_batch, batch)
            return self.metrics.record(combined, decay_loss + combined.model_loss, batch, lr)

    @property
    def measures_noise(self) -> bool:
        """Each tower's gradient is a small batch's: with several replicas, unless gathered
        (model.cross_tower), where a tower's gradient is its share of the batch's."""
        return self.replicas > 1 and not self.tower_gradients.gather

    def _update_noise(self, combined: TowerGradients, local_batch: int, batch: int) -> None:
        if self.measures_noise and local_batch % self.towers == 0:
            self.noise.update(
                combined.small_norm_sq, combined.big_norm_sq, local_batch // self.towers, batch
            )

    def noise_scale(self) -> float | None:
        """B_simple so far; None with one replica or gathered towers (nothing to measure)."""
        return self.noise.value() if self.measures_noise else None

    def adascale_state(self) -> AdaScaleState | None:
        """AdaScale's gain, averages and tau (None without AdaScale)."""
        return None if self.adascale is None else self.adascale.read()

    def saved_state(self) -> dict[str, Any]:
        """The step's own state a resumed run needs, by its checkpoint names: the weight EMA,
        the noise-scale averages, the epoch's metric sums; float16's loss scale and AdaScale's
        averages where the run has them."""
        scaled = {"loss_scale": self.loss_scale} if self.loss_scale.dynamic else {}
        adascale = {"adascale": self.adascale} if self.adascale is not None else {}
        return {
            "ema": self.ema_weights,
            "noise": self.noise,
            "metric_sums": self.metrics.sums,
            "lr_sums": self.metrics.lr_sums,
            **scaled,
            **adascale,
        }


def seeded_network(config: TrainConfig, manifest: Manifest, parameter_device: str) -> Network:
    """The configured network for `manifest`'s examples and classes at its seeded initial weights,
    on the parameter device; refused when its regularizers and the optimizer would both decay
    the weights."""
    keras.utils.set_random_seed(config.seed)
    input_shape = network_input_shape(manifest.features, config.crop_size)
    with tf.device(parameter_device):
        network = build_network(
            config.model,
            input_shape,
            len(manifest.classes),
            config.seed,
            config.precision,
            config.loss,
        )
    check_weight_decay_once(network.model, config)
    if config.ema_scale != 1.0:
        scale_batch_norm_momentum(network.model, config.scaled_momentum)
    return network


def tower_trainer(
    network: Network,
    config: TrainConfig,
    devices: TowerDevices,
    learning_rate: float | keras.optimizers.schedules.LearningRateSchedule,
    cluster: Cluster | None = None,
    adascale: AdaScale | None = None,
    weight_average: bool = True,
) -> TowerTrainer:
    """The tower step of `network` as `config` describes it: its optimizer (model.optimizers) on
    `learning_rate`, the loss, the aggregation, the L2 weight decay, XLA, the precision and (unless
    `weight_average` is off) the weights' EMA. Training, the advise probe, gradcheck and the
    step benchmark all build their trainer here."""
    return TowerTrainer(
        network,
        build_optimizer(config, learning_rate),
        devices,
        config.aggregation,
        config.l2_weight_decay,
        config.scaled_momentum(config.ema_decay) if weight_average else None,
        config.xla,
        cluster,
        config.precision,
        adascale,
        config.loss,
        config.temperature,
        config.cross_tower,
    )
