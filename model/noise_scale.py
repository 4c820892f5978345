"""Gradient noise scale B_simple (McCandlish et al. 2018, appendix A.1) from tower gradients.

Towers give two batch sizes for free each step: every tower's gradient (B_small = per-tower
batch) and the combined one (B_big = global batch). Unbiased estimates:
    |G|^2   = (B_big |G_big|^2 - B_small |G_small|^2) / (B_big - B_small)
    tr(S)   = (|G_small|^2 - |G_big|^2) / (1/B_small - 1/B_big)
Each is smoothed with a bias-corrected exponential moving average before dividing,
B_simple = tr(S) / |G|^2, because the per-step ratio is far too noisy (and often negative).
"""

from __future__ import annotations

import tensorflow as tf

from towerbench.model.step_variables import NewVariable, new_tf_variable

NOISE_EMA_DECAY = 0.99


def noise_estimates(
    small_norm_sq: float, big_norm_sq: float, batch_small: float, batch_big: float
) -> tuple[float, float]:
    """(|G|^2, tr(Sigma)) estimated from one step's squared gradient norms (floats or tensors)."""
    if batch_big <= batch_small:
        raise ValueError(f"B_big ({batch_big}) must exceed B_small ({batch_small})")
    true_sq = (batch_big * big_norm_sq - batch_small * small_norm_sq) / (batch_big - batch_small)
    trace = (small_norm_sq - big_norm_sq) / (1.0 / batch_small - 1.0 / batch_big)
    return true_sq, trace


class NoiseScaleEstimator(tf.Module):
    """Exponential moving averages of |G|^2 and tr(Sigma), updated inside the training step
    (the trainer's, and towerbench.keras.NoiseScale's in `fit`); its variables come from
    `new_variable` (model/step_variables.py)."""

    def __init__(
        self,
        decay: float = NOISE_EMA_DECAY,
        name: str = "noise_scale",
        new_variable: NewVariable = new_tf_variable,
    ):
        super().__init__(name=name)
        self.decay = decay
        self.true_sq = new_variable("true_sq_ema", 0.0, tf.float32)
        self.trace = new_variable("trace_ema", 0.0, tf.float32)
        self.updates = new_variable("updates", 0.0, tf.float32)

    def update(self, small_norm_sq, big_norm_sq, batch_small: float, batch_big: float) -> None:
        """Fold one step's estimates in; a step whose norms overflowed (float16) leaves them."""
        true_sq, trace = noise_estimates(small_norm_sq, big_norm_sq, batch_small, batch_big)
        finite = tf.math.logical_and(tf.math.is_finite(true_sq), tf.math.is_finite(trace))
        keep = tf.where(finite, self.decay, 1.0)
        self.true_sq.assign(keep * self.true_sq + (1.0 - keep) * tf.where(finite, true_sq, 0.0))
        self.trace.assign(keep * self.trace + (1.0 - keep) * tf.where(finite, trace, 0.0))
        self.updates.assign_add(tf.cast(finite, tf.float32))

    def value(self) -> float:
        """B_simple from the bias-corrected averages; NaN before the first update."""
        # Both averages start at 0 and share one bias correction, which cancels in the ratio.
        true_sq = float(self.true_sq.numpy())
        if float(self.updates.numpy()) == 0 or true_sq == 0:
            return float("nan")
        return float(self.trace.numpy()) / true_sq
