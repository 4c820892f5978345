"""AdaScale (Johnson et al. 2020; model/adascale.py holds its estimator) as a Keras optimizer
wrapper for `model.fit` under `tf.distribute.MirroredStrategy`, like Keras' own
`LossScaleOptimizer`: `AdaScale(inner_optimizer, reference_batch=b0, global_batch=B)`.

The inner optimizer's learning rate is read as the reference batch's schedule, counted in
reference steps. Each step the wrapper
1. sums the replicas' gradients with their squared norms (model/keras_gradients.py);
2. folds the step's estimates into AdaScale's averages and sets the gain r;
3. lets the inner optimizer apply the summed gradients at the LR schedule(tau) x r^power
   (power 1 for SGD-like optimizers, 1/2 for adaptive ones: AdamScale);
4. advances the progress tau by r.
`gain` and `progress` are the wrapper's variables; `AdaScaleProgress` logs them to the fit's
History and ends `fit` when tau reaches the reference's number of steps.

Where it differs from towerbench's trainer: the gradients include the loss's regularization
terms (the trainer measures the data gradients only), and a short last batch counts as a full
one (batch with `drop_remainder=True` for the trainer's accounting).
"""

from __future__ import annotations

import keras
import tensorflow as tf

from towerbench.model.adascale import AdaScale as AdaScaleState
from towerbench.model.adascale import AdaScaleSchedule, ScaleInvariantBudget
from towerbench.model.keras_gradients import MeasuringWrapper, ReplicaGradients

# Optimizers that divide the step by a running gradient scale: AdaScale's gain enters their LR
# to the power 1/2 (config/optimizers.py:adascale_power, for the trainer's).
ADAPTIVE = (
    keras.optimizers.Adam,
    keras.optimizers.AdamW,
    keras.optimizers.Adamax,
    keras.optimizers.Nadam,
    keras.optimizers.RMSprop,
    keras.optimizers.Adagrad,
    keras.optimizers.Adadelta,
    keras.optimizers.Adafactor,
    keras.optimizers.Lamb,
)


@keras.saving.register_keras_serializable(package="towerbench")
class AdaScale(MeasuringWrapper):
    """`inner_optimizer` with AdaScale's gain on its LR and its schedule at the progress tau;
    `inner_optimizer`'s learning rate is the reference batch `reference_batch`'s, in its steps."""

    def __init__(
        self,
        inner_optimizer: keras.optimizers.Optimizer,
        reference_batch: int,
        global_batch: int,
        power: float | None = None,
        smoothing: float | None = None,
        name: str = "adascale",
    ):
        if min(reference_batch, global_batch) < 1:
            raise ValueError(
                f"reference_batch ({reference_batch}) and global_batch ({global_batch}) "
                "must be >= 1"
            )
        if hasattr(inner_optimizer, "inner_optimizer"):
            raise ValueError(
                f"AdaScale wraps a plain optimizer, not a {type(inner_optimizer).__name__}; "
                "for mixed precision wrap AdaScale in the LossScaleOptimizer, not the reverse"
            )
        super().__init__(inner_optimizer, name)
        self.reference_batch = reference_batch
        self.global_batch = global_batch
        adaptive = isinstance(inner_optimizer, ADAPTIVE)
        self.power = (0.5 if adaptive else 1.0) if power is None else power
        self.smoothing = smoothing
        reference = inner_optimizer.get_config()["learning_rate"]
        if isinstance(reference, dict):
            reference = keras.optimizers.schedules.deserialize(reference)
        if isinstance(reference, AdaScaleSchedule):  # deserialized from an AdaScale's config
            reference = reference.reference
        self.schedule = AdaScaleSchedule(reference, self.power)
        inner_optimizer.learning_rate = self.schedule
        self.state: AdaScaleState | None = None

    def build_state(self, replicas: int) -> None:
        if self.global_batch % replicas:
            raise ValueError(
                f"AdaScale: global_batch {self.global_batch} does not split evenly over "
                f"{replicas} replicas"
            )
        self.state = AdaScaleState(
            self.reference_batch,
            self.global_batch,
            replicas,
            self.smoothing,
            new_variable=self.new_variable,
        )
        self.schedule.state = self.state

    def measured(self, gradients: ReplicaGradients) -> None:
        state = self._built_state()
        state.update(gradients.small_norm_sq, gradients.big_norm_sq, self.global_batch)

    def alone(self) -> None:
        self._built_state().update(tf.constant(0.0), tf.constant(0.0), self.global_batch)

    def applied(self) -> None:
        self._built_state().advance()

    @property
    def gain(self) -> keras.Variable:
        """This step's gain r (1 before the first step)."""
        return self._built_state().gain

    @property
    def progress(self) -> keras.Variable:
        """tau: the progress in reference steps, the sum of the gains."""
        return self._built_state().tau

    def _built_state(self) -> AdaScaleState:
        if self.state is None:
            raise ValueError("AdaScale is built by its first step (or build(variables))")
        return self.state

    @property
    def learning_rate(self):
        return self.inner_optimizer.learning_rate

    @learning_rate.setter
    def learning_rate(self, learning_rate):
        del learning_rate
        raise TypeError("AdaScale's learning rate is its inner optimizer's schedule at tau")

    def get_config(self):
        return {
            "name": self.name,
            "inner_optimizer": keras.optimizers.serialize(self.inner_optimizer),
            "reference_batch": self.reference_batch,
            "global_batch": self.global_batch,
            "power": self.power,
            "smoothing": self.smoothing,
        }

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        inner = keras.optimizers.deserialize(
            config.pop("inner_optimizer"), custom_objects=custom_objects
        )
        return cls(inner, **config)


class AdaScaleProgress(keras.callbacks.Callback):
    """Logs AdaScale's `adascale_gain` and `adascale_progress` (tau) each epoch to the fit's
    History and, given `reference_steps`, ends `fit` once tau reaches them (the reference
    configuration's number of steps: the trainer's scale-invariant budget, which it reads
    only when enough steps have passed to reach it, as the trainer does)."""

    def __init__(self, reference_steps: int | None = None):
        super().__init__()
        self.reference_steps = reference_steps
        self.adascale: AdaScale | None = None
        self.budget: ScaleInvariantBudget | None = None
        self.steps_to_next_reading = 0

    def on_train_begin(self, logs=None):
        del logs
        optimizer = self.model.optimizer
        while not isinstance(optimizer, AdaScale):
            optimizer = getattr(optimizer, "inner_optimizer", None)
            if optimizer is None:
                raise ValueError("AdaScaleProgress needs a model compiled with AdaScale")
        self.adascale = optimizer
        if self.reference_steps is not None:
            max_gain = max(optimizer.global_batch / optimizer.reference_batch, 1.0)
            self.budget = ScaleInvariantBudget(self.reference_steps, max_gain)
            self.steps_to_next_reading = 0

    def on_train_batch_end(self, batch, logs=None):
        del batch, logs
        if self.budget is None or self.adascale is None:
            return
        self.steps_to_next_reading -= 1
        if self.steps_to_next_reading > 0:
            return
        left = self.budget.steps_left(float(self.adascale.progress.numpy()))
        self.steps_to_next_reading = left
        if left == 0:
            self.model.stop_training = True

    def on_epoch_end(self, epoch, logs=None):
        del epoch
        if logs is not None and self.adascale is not None:
            logs["adascale_gain"] = float(self.adascale.gain.numpy())
            logs["adascale_progress"] = float(self.adascale.progress.numpy())
