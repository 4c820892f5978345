"""AdaScale SGD (Johnson, Agrawal, Gu, Guestrin, ICML 2020, arXiv 2007.05105) for towers.

A run at global batch B = S x b0, where b0 is the reference batch its LR schedule was tuned for,
multiplies each step's learning rate by the gain ratio
    r = (sigma^2 + |mu|^2) / (sigma^2 / S + |mu|^2),    1 <= r <= S  (S >= 1),
where mu is the expected gradient and sigma^2 = tr(Sigma) / b0 the variance of a b0-example
gradient (Sigma: the covariance of one example's gradient). It counts scale-invariant progress
tau += r per step, evaluates the LR schedule at tau (in reference steps, not at the step count)
and ends the run when tau reaches the reference configuration's number of steps. With the noise
scale B_noise = tr(Sigma) / |mu|^2 of model.noise_scale, r = (1 + B_noise/b0) / (1 + B_noise/B):
about S while B is well below B_noise, about 1 well above it.

Estimates. Each step the towers give `small` = the mean over the R replicas (all towers of all
workers) of |g_t|^2, each g_t the mean gradient of b = B / R examples, and `big` = |mean_t g_t|^2.
For independent examples
    E small = |mu|^2 + tr(Sigma) / b,        E big = |mu|^2 + tr(Sigma) / B,
so   tr(Sigma) = (small - big) / (1/b - 1/B)   and   |mu|^2 = (B big - b small) / (B - b)
are unbiased one-step estimates (model.noise_scale.noise_estimates); sigma^2 = tr(Sigma) / b0.
They are fairscale's (fairscale/optim/adascale.py, the paper's appendix B.3), which writes
sigma^2 = S / (R - 1) (small - big) and |mu|^2 = big - sigma^2 / S: the same numbers.

Smoothing. Both are averaged over steps with fairscale's default: a bias-corrected exponential
moving average with factor max(1 - R/1000, 0), about the last 1000 / R steps (1000 replica
gradients). Unlike fairscale, which clamps each step's estimate (sigma^2 >= 1e-6, |mu|^2 >= 0)
before averaging, the unbiased one-step estimates are averaged and the averages clamped at 0 when
r is formed: one step's |mu|^2 is often negative where noise dominates, and clamping it first
would bias |mu|^2 up and r down. tr(Sigma) is averaged per example, so a step with another batch
(an epoch's short last batch) uses the same averages with its own S.

Where it is biased:
- r is a ratio of averages, a nonlinear function of them: for a finite window E r_hat != r
  (Jensen); it is consistent only as the window grows while the gradients stay stationary.
- The averages lag: over the window |mu|^2 falls as training progresses, so the average
  overstates it and r is underestimated while the loss falls fast.
- Small R: one step's tr(Sigma) rests on R - 1 degrees of freedom; at R = 2 it is very noisy,
  which the window of about 1000 / R steps offsets.
- An epoch draws examples without replacement from N: then tr(Sigma) is unbiased for the sample
  covariance (denominator N - 1) and |mu|^2 is biased by -tr(Sigma) / (N - 1), a relative error
  of B_noise / N (small when N is well above the noise scale).
- Step t's gain comes from step t's own gradients (as in fairscale), so r is correlated with the
  update it scales.
- The norms are of the data gradients: weight decay, added after combining, is deterministic and
  leaves sigma^2 alone, but |mu|^2 here excludes it (as fairscale's hooks exclude torch's
  `weight_decay`).

With one replica nothing can be estimated, and with S = 1 the gain is 1 whatever the estimates:
in both cases r is exactly 1 and tau counts steps, so the LR schedule sees the step count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import keras
import tensorflow as tf

from towerbench.model.input_pipeline import EpochPlan
from towerbench.model.noise_scale import noise_estimates
from towerbench.model.schedules import EpochSchedule
from towerbench.model.step_variables import NewVariable, new_tf_variable

# fairscale's default smoothing: an average over about this many replica gradients.
SMOOTHING_GRADIENTS = 1000


def default_smoothing(replicas: int) -> float:
    """fairscale's moving-average factor for R replicas: max(1 - R/1000, 0)."""
    return max(1.0 - replicas / SMOOTHING_GRADIENTS, 0.0)


def gain_ratio(sigma_sq, mu_sq, scale: float):
    """r = (sigma^2 + |mu|^2) / (sigma^2 / S + |mu|^2) for floats or tensors (not both 0)."""
    return (sigma_sq + mu_sq) / (sigma_sq / scale + mu_sq)


@dataclass(frozen=True)
class AdaScaleState:
    """What a run logs: the gain of a step at the run's global batch (an epoch's short last
    batch gets less), the averaged sigma^2 (at the reference batch) and |mu|^2, and the
    scale-invariant progress tau in reference steps."""

    gain: float
    sigma_sq: float
    mu_sq: float
    tau: float


class AdaScale(tf.Module):
    """The gain's moving averages and tau, updated inside the training step.

    Per step, before the optimizer applies the update: `update(small, big, global_batch)` (the
    LR schedule then reads `gain` and `tau`); after it: `advance()` (tau += gain). Its variables
    come from `new_variable` (the Keras wrapper, model/keras_adascale.py, makes them the
    optimizer's own).
    """

    def __init__(
        self,
        reference_batch: int,
        global_batch: int,
        replicas: int,
        smoothing: float | None = None,
        name: str = "adascale",
        new_variable: NewVariable = new_tf_variable,
    ):
        super().__init__(name=name)
        if min(reference_batch, global_batch, replicas) < 1:
            raise ValueError(
                f"reference_batch ({reference_batch}), global_batch ({global_batch}) and "
                f"replicas ({replicas}) must be >= 1"
            )
        self.reference_batch = reference_batch
        self.global_batch = global_batch
        self.replicas = replicas
        self.smoothing = default_smoothing(replicas) if smoothing is None else smoothing
        if not 0.0 <= self.smoothing < 1.0:
            raise ValueError(f"smoothing must be in [0, 1), got {self.smoothing}")
        # Biased averages of tr(Sigma) (per example) and |mu|^2, and the average of 1 that
        # removes their bias towards the initial 0.
        self.trace_average = new_variable("trace_average", 0.0, tf.float32)
        self.mu_sq_average = new_variable("mu_sq_average", 0.0, tf.float32)
        self.weight = new_variable("weight", 0.0, tf.float32)
        self.gain = new_variable("gain", 1.0, tf.float32)
        # float64: adding gains of 1 stays exact far beyond any run's step count.
        self.tau = new_variable("tau", 0.0, tf.float64)

    def scale(self, global_batch: int) -> float:
        """S = B / b0 of a step with `global_batch` examples."""
        return global_batch / self.reference_batch

    def update(self, small_norm_sq, big_norm_sq, global_batch: int) -> None:
        """Fold one step's estimates into the averages (when the batch splits evenly over two or
        more replicas and the norms are finite), then set this step's gain."""
        if self.replicas > 1 and global_batch % self.replicas == 0:
            per_replica = global_batch // self.replicas
            mu_sq, trace = noise_estimates(small_norm_sq, big_norm_sq, per_replica, global_batch)
            finite = tf.math.logical_and(tf.math.is_finite(trace), tf.math.is_finite(mu_sq))
            keep = tf.where(finite, self.smoothing, 1.0)  # a float16 overflow leaves them
            self.trace_average.assign(
                keep * self.trace_average + (1.0 - keep) * tf.where(finite, trace, 0.0)
            )
            self.mu_sq_average.assign(
                keep * self.mu_sq_average + (1.0 - keep) * tf.where(finite, mu_sq, 0.0)
            )
            self.weight.assign(keep * self.weight + (1.0 - keep))
        self.gain.assign(self._gain(self.scale(global_batch)))

    def _gain(self, scale: float) -> tf.Tensor:
        if self.replicas == 1 or scale == 1.0:
            return tf.constant(1.0)
        sigma_sq, mu_sq = self._averages()
        # Nothing averaged yet (or a zero gradient): no evidence for a gain.
        evidence = sigma_sq / scale + mu_sq > 0.0
        return tf.where(evidence, gain_ratio(sigma_sq, mu_sq, scale), 1.0)

    def _averages(self) -> tuple[tf.Tensor, tf.Tensor]:
        """Bias-corrected (sigma^2 at the reference batch, |mu|^2), clamped at 0."""
        trace = tf.math.divide_no_nan(self.trace_average, self.weight)
        mu_sq = tf.math.divide_no_nan(self.mu_sq_average, self.weight)
        return tf.maximum(trace, 0.0) / self.reference_batch, tf.maximum(mu_sq, 0.0)

    def advance(self) -> None:
        """tau += this step's gain."""
        self.tau.assign_add(tf.cast(self.gain, tf.float64))

    def read(self) -> AdaScaleState:
        """The current values as floats (reading waits for the device)."""
        sigma_sq, mu_sq = self._averages()
        return AdaScaleState(
            gain=float(self._gain(self.scale(self.global_batch)).numpy()),
            sigma_sq=float(sigma_sq.numpy()),
            mu_sq=float(mu_sq.numpy()),
            tau=float(self.tau.numpy()),
        )


def reference_steps_per_epoch(examples: int, reference_batch: int) -> int:
    """Steps per epoch of the reference configuration: one tower at the reference batch."""
    return EpochPlan(examples, reference_batch, 1).steps


def reference_schedule(base_lr: float, schedule: EpochSchedule) -> EpochSchedule:
    """`schedule` as the reference batch runs it: peak = base LR, no warmup (AdaScale's gain
    takes warmup's place; Johnson et al. train without one), decay in reference epochs."""
    return EpochSchedule(
        base_lr=base_lr,
        peak_lr=base_lr,
        warmup_epochs=0.0,
        decay=schedule.decay,
        total_epochs=schedule.total_epochs,
        decay_epochs=schedule.decay_epochs,
        decay_factor=schedule.decay_factor,
        decay_boundaries=tuple(schedule.decay_boundaries),
    )


@keras.saving.register_keras_serializable(package="towerbench")
class AdaScaleSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """The optimizer's LR under AdaScale: the reference batch's schedule (counted in reference
    steps) at the progress tau, times the gain to the power `power` (1 for SGD-like optimizers;
    1/2 for adaptive ones, AdaptDL's AdamScale, whose step already divides by the gradient's
    scale). The optimizer's step counter is ignored once `state` is set: progress is tau. The
    trainer and the Keras wrapper (model/keras_adascale.py) both use it."""

    def __init__(
        self,
        reference: float | keras.optimizers.schedules.LearningRateSchedule,
        power: float = 1.0,
        state: AdaScale | None = None,
    ):
        self.reference = reference
        self.power = float(power)
        self.state = state

    def __call__(self, step):
        if self.state is None:
            return self._reference(step)
        tau = tf.cast(self.state.tau, tf.float32)
        return self._reference(tau) * tf.cast(self.state.gain, tf.float32) ** self.power

    def _reference(self, step):
        if callable(self.reference):
            return tf.cast(self.reference(step), tf.float32)
        return tf.constant(self.reference, tf.float32)

    def get_config(self):
        reference = self.reference
        if isinstance(reference, keras.optimizers.schedules.LearningRateSchedule):
            reference = keras.optimizers.schedules.serialize(reference)
        return {"reference": reference, "power": self.power}

    @classmethod
    def from_config(cls, config):
        reference = config["reference"]
        if isinstance(reference, dict):
            reference = keras.optimizers.schedules.deserialize(reference)
        return cls(reference, config["power"])


@dataclass(frozen=True)
class ScaleInvariantBudget:
    """A run ends when tau reaches the reference configuration's number of steps.

    tau grows by at most max(S, 1) per step, so the loop need only read tau (a wait for the
    device) once `steps_left` steps have passed since the last reading.
    """

    reference_steps: int
    max_gain: float

    @classmethod
    def of(
        cls, epochs: float, examples: int, reference_batch: int, global_batch: int
    ) -> ScaleInvariantBudget:
        """The budget of `epochs` reference epochs for a run at `global_batch`."""
        steps = max(round(epochs * reference_steps_per_epoch(examples, reference_batch)), 1)
        return cls(reference_steps=steps, max_gain=max(global_batch / reference_batch, 1.0))

    def steps_left(self, tau: float) -> int:
        """The fewest steps that can bring tau to the budget; 0 once it is reached."""
        return max(math.ceil((self.reference_steps - tau) / self.max_gain), 0)
