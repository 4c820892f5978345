"""The gradient noise scale B_simple (McCandlish et al. 2018; model/noise_scale.py, the
trainer's estimator) measured during a user's own `fit` under `tf.distribute.MirroredStrategy`,
from the replicas' gradients: `fit(..., callbacks=[NoiseScale(global_batch=B)])`.

A callback sees no gradients, so for the fit `NoiseScale` wraps the model's optimizer in
`NoiseMeasuring` (model/keras_gradients.py: the replicas' gradients summed with their squared
norms, then the user's optimizer applies them; under mixed precision inside Keras'
LossScaleOptimizer, on unscaled gradients) and rebuilds the train function; at the fit's end
the model gets its own optimizer back. Its averages restart with each fit and are not saved.
Each epoch it logs `noise_scale` to the fit's History and, when an MLflow run is active in the
process, to that run.
"""

from __future__ import annotations

import math
import sys

import keras

from towerbench.model.keras_gradients import MeasuringWrapper, ReplicaGradients
from towerbench.model.noise_scale import NOISE_EMA_DECAY, NoiseScaleEstimator


class NoiseMeasuring(MeasuringWrapper):
    """`inner_optimizer`, with the noise scale's averages updated from each step's replicas."""

    def __init__(
        self,
        inner_optimizer: keras.optimizers.Optimizer,
        global_batch: int,
        decay: float = NOISE_EMA_DECAY,
        name: str = "noise_measuring",
    ):
        super().__init__(inner_optimizer, name)
        self.global_batch = global_batch
        self.decay = decay
        self.replicas = 1
        self.estimator: NoiseScaleEstimator | None = None

    def build_state(self, replicas: int) -> None:
        if self.global_batch % replicas:
            raise ValueError(
                f"NoiseScale: global_batch {self.global_batch} does not split evenly over "
                f"{replicas} replicas"
            )
        self.replicas = replicas
        # Plain variables, not the optimizer's: a checkpoint during the fit holds the user's
        # optimizer's state alone, as a model compiled with it expects.
        self.estimator = NoiseScaleEstimator(self.decay)

    @property
    def variables(self):
        return self.inner_optimizer.variables

    def measured(self, gradients: ReplicaGradients) -> None:
        if self.estimator is not None:
            self.estimator.update(
                gradients.small_norm_sq,
                gradients.big_norm_sq,
                self.global_batch // self.replicas,
                self.global_batch,
            )

    def value(self) -> float:
        """B_simple so far; NaN before a step with several replicas."""
        return float("nan") if self.estimator is None else self.estimator.value()


class NoiseScale(keras.callbacks.Callback):
    """Logs the gradient noise scale `noise_scale` each epoch, measured from the replicas'
    gradients of batches of `global_batch` examples (NaN with one replica)."""

    def __init__(self, global_batch: int, decay: float = NOISE_EMA_DECAY):
        super().__init__()
        if global_batch < 2:
            raise ValueError(f"global_batch must be >= 2, got {global_batch}")
        self.global_batch = global_batch
        self.decay = decay
        self.measuring: NoiseMeasuring | None = None

    def on_train_begin(self, logs=None):
        del logs
        holder = self._loss_scale_optimizer()
        own = self.model.optimizer if holder is None else holder.inner_optimizer
        with self.model.distribute_strategy.scope():
            self.measuring = NoiseMeasuring(own, self.global_batch, self.decay)
            self.measuring.build(self.model.trainable_variables)
        self._hand_over(self.measuring, holder)

    def on_train_end(self, logs=None):
        del logs
        if self.measuring is not None:
            self._hand_over(self.measuring.inner_optimizer, self._loss_scale_optimizer())

    def _loss_scale_optimizer(self) -> keras.optimizers.LossScaleOptimizer | None:
        """Mixed precision's wrapper, when the model has one: the measuring goes inside it, where
        the gradients are unscaled and a step that overflowed is skipped."""
        optimizer = self.model.optimizer
        return optimizer if isinstance(optimizer, keras.optimizers.LossScaleOptimizer) else None

    def _hand_over(
        self,
        optimizer: keras.optimizers.Optimizer,
        holder: keras.optimizers.LossScaleOptimizer | None,
    ) -> None:
        """`optimizer` as the one the model's steps apply (inside `holder` if any), with the
        train function rebuilt to call it."""
        if holder is None:
            self.model.optimizer = optimizer
        else:
            holder.inner_optimizer = optimizer
        self.model.make_train_function(force=True)

    def on_epoch_end(self, epoch, logs=None):
        if self.measuring is None:
            return
        value = self.measuring.value()
        if logs is not None:
            logs["noise_scale"] = value
        mlflow = sys.modules.get("mlflow")  # logged where the user tracks, never imported here
        if mlflow is not None and mlflow.active_run() is not None and math.isfinite(value):
            mlflow.log_metric("noise_scale", value, step=epoch + 1)
