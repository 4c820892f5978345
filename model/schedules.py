"""Learning-rate policy counted in epochs, so the number of towers never changes its shape.

peak LR = base_lr * (global_batch / reference_batch) ** {none: 0, linear: 1, sqrt: 1/2}.
Warmup (Goyal et al. 2017): linear from base_lr to the peak over `warmup_epochs`.
Decay multiplies the (warmed-up) LR: staircase (x decay_factor every decay_epochs, the tutorial's
x0.1 every 350 epochs), piecewise (x decay_factor at each boundary epoch), cosine or linear (to 0
at the last epoch, starting after warmup; linear after a warmup is the one-cycle shape) or
constant.
The optimizer's step counter is turned into epochs with `steps_per_epoch`, so a checkpointed
step resumes the schedule exactly. `keras_schedule` gives the same LR at every step as Keras' own
schedule where one fits, for a user's `model.fit` (towerbench.keras).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import keras
import numpy as np
import tensorflow as tf

# The values of config.sections.TrainConfig.decay (tests/test_model_schedules.py checks they agree).
Decay = Literal["constant", "staircase", "piecewise", "cosine", "linear"]
# adascale: the peak stays base_lr; model.adascale multiplies each step's LR by its gain.
SCALING_EXPONENTS = {"none": 0.0, "linear": 1.0, "sqrt": 0.5, "adascale": 0.0}


def scaled_learning_rate(
    base_lr: float, global_batch: int, reference_batch: int, rule: str
) -> float:
    """The peak learning rate for `global_batch` under scaling `rule`."""
    if rule not in SCALING_EXPONENTS:
        raise ValueError(f"unknown lr scaling {rule!r}; choose none, linear, sqrt or adascale")
    return base_lr * (global_batch / reference_batch) ** SCALING_EXPONENTS[rule]


@dataclass(frozen=True)
class EpochSchedule:
    """The learning rate as a function of (fractional) epochs."""

    base_lr: float
    peak_lr: float
    warmup_epochs: float
    decay: Decay
    total_epochs: float
    decay_epochs: float = 350.0
    decay_factor: float = 0.1
    decay_boundaries: Sequence[float] = ()

    def __call__(self, epoch: tf.Tensor | float) -> tf.Tensor:
        """LR at `epoch` (float32 tensor); works in graphs and eagerly."""
        epoch = tf.cast(epoch, tf.float32)
        if self.warmup_epochs > 0:
            progress = tf.minimum(epoch / self.warmup_epochs, 1.0)
            lr = self.base_lr + (self.peak_lr - self.base_lr) * progress
        else:
            lr = tf.constant(self.peak_lr, tf.float32)
        return lr * self._decay_multiplier(epoch)

    def _decay_multiplier(self, epoch: tf.Tensor) -> tf.Tensor:
        if self.decay == "constant":
            return tf.constant(1.0)
        if self.decay == "staircase":
            return self.decay_factor ** tf.floor(epoch / self.decay_epochs)
        if self.decay == "piecewise":
            passed = tf.add_n(
                [tf.cast(epoch >= boundary, tf.float32) for boundary in self.decay_boundaries]
                or [tf.constant(0.0)]
            )
            return self.decay_factor**passed
        if self.decay in ("cosine", "linear"):
            span = max(self.total_epochs - self.warmup_epochs, 1e-9)
            progress = tf.clip_by_value((epoch - self.warmup_epochs) / span, 0.0, 1.0)
            if self.decay == "linear":
                return 1.0 - progress
            return 0.5 * (1.0 + tf.cos(math.pi * progress))
        raise ValueError(f"unknown decay {self.decay!r}")


@keras.saving.register_keras_serializable(package="towerbench")
class StepSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """Adapts an `EpochSchedule` to the optimizer's step counter."""

    def __init__(self, schedule: EpochSchedule, steps_per_epoch: float):
        self.schedule = schedule
        self.steps_per_epoch = float(steps_per_epoch)

    def __call__(self, step):
        return self.schedule(tf.cast(step, tf.float32) / self.steps_per_epoch)

    def get_config(self):
        fields = {**self.schedule.__dict__}
        fields["decay_boundaries"] = list(self.schedule.decay_boundaries)
        return {"steps_per_epoch": self.steps_per_epoch, **fields}

    @classmethod
    def from_config(cls, config):
        """The schedule `get_config` described (Keras' deserialize calls this)."""
        fields = dict(config)
        steps_per_epoch = fields.pop("steps_per_epoch")
        fields["decay_boundaries"] = tuple(fields["decay_boundaries"])
        return cls(EpochSchedule(**fields), steps_per_epoch)


def keras_schedule(
    schedule: EpochSchedule, steps_per_epoch: float
) -> float | keras.optimizers.schedules.LearningRateSchedule:
    """`schedule` counted in optimizer steps, as Keras' own schedule where one gives the same LR
    at every step (a float when constant, `CosineDecay` with `warmup_target`, and without warmup
    `PiecewiseConstantDecay`, `ExponentialDecay(staircase=True)` or `PolynomialDecay`); else a
    `StepSchedule`."""
    schedules = keras.optimizers.schedules
    epoch_steps = float(steps_per_epoch)
    warmup_steps = schedule.warmup_epochs * epoch_steps
    decay_steps = (schedule.total_epochs - schedule.warmup_epochs) * epoch_steps
    if schedule.decay == "cosine" and decay_steps > 0:
        warmed = warmup_steps > 0  # the decay starts after the warmup, even a flat one
        return schedules.CosineDecay(
            schedule.base_lr if warmed else schedule.peak_lr,
            decay_steps,
            warmup_target=schedule.peak_lr if warmed else None,
            warmup_steps=warmup_steps,
        )
    if warmup_steps > 0:
        return StepSchedule(schedule, epoch_steps)
    peak = schedule.peak_lr
    never_drops = schedule.decay == "piecewise" and not schedule.decay_boundaries
    if schedule.decay == "constant" or never_drops:
        return peak
    if schedule.decay == "piecewise":
        # The LR drops at the first step at or after each boundary; Keras' drops after it.
        boundaries = sorted(_first_step_at(b, epoch_steps) - 1 for b in schedule.decay_boundaries)
        values = [peak * schedule.decay_factor**drops for drops in range(len(boundaries) + 1)]
        return schedules.PiecewiseConstantDecay(boundaries, values)
    if schedule.decay == "staircase":
        return schedules.ExponentialDecay(
            peak, schedule.decay_epochs * epoch_steps, schedule.decay_factor, staircase=True
        )
    if schedule.decay == "linear" and decay_steps > 0:
        return schedules.PolynomialDecay(peak, decay_steps, end_learning_rate=0.0, power=1.0)
    return StepSchedule(schedule, epoch_steps)


def _first_step_at(epoch: float, steps_per_epoch: float) -> int:
    """The first step whose epoch, step / steps_per_epoch in float32 as `EpochSchedule` counts
    it, is at or past `epoch` (b x E can round to either side of a whole step)."""
    target, per_epoch = np.float32(epoch), np.float32(steps_per_epoch)
    step = max(math.ceil(epoch * steps_per_epoch) - 1, 0)
    while np.float32(step) / per_epoch < target:
        step += 1
    while step > 0 and np.float32(step - 1) / per_epoch >= target:
        step -= 1
    return step


def schedule_from_config(config, global_batch: int | None = None) -> EpochSchedule:
    """The `EpochSchedule` a TrainConfig describes (optionally at another global batch)."""
    batch = config.global_batch if global_batch is None else global_batch
    return EpochSchedule(
        base_lr=config.base_lr,
        peak_lr=scaled_learning_rate(
            config.base_lr, batch, config.reference_batch, config.lr_scaling
        ),
        warmup_epochs=config.warmup_epochs,
        decay=config.decay,
        total_epochs=config.epochs,
        decay_epochs=config.decay_epochs,
        decay_factor=config.decay_factor,
        decay_boundaries=tuple(config.decay_boundaries),
    )
