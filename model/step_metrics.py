"""The training metrics of the tower step, accumulated in variables so the hot loop never waits
for a host read."""

from __future__ import annotations

import tensorflow as tf

from towerbench.model.tower_gradients import TowerGradients


class StepMetrics:
    """Cross-entropy, accuracy and the learning rate the steps used, summed since the last
    reset (an epoch); the last step's losses."""

    def __init__(self):
        self.cross_entropy_sum = tf.Variable(0.0, trainable=False, dtype=tf.float64)
        self.correct = tf.Variable(0, trainable=False, dtype=tf.int64)
        self.examples = tf.Variable(0, trainable=False, dtype=tf.int64)
        self.last_loss = tf.Variable(0.0, trainable=False)
        self.last_cross_entropy = tf.Variable(0.0, trainable=False)
        self.weight_decay_loss = tf.Variable(0.0, trainable=False)
        self.lr_sum = tf.Variable(0.0, trainable=False, dtype=tf.float64)
        self.lr_steps = tf.Variable(0, trainable=False, dtype=tf.int64)
        self.lr_first = tf.Variable(0.0, trainable=False)
        self.lr_last = tf.Variable(0.0, trainable=False)

    @property
    def sums(self) -> list[tf.Variable]:
        """The running epoch's sums of the loss and accuracy (what a checkpoint keeps)."""
        return [self.cross_entropy_sum, self.correct, self.examples]

    @property
    def lr_sums(self) -> list[tf.Variable]:
        """The running epoch's LR sum, steps, first and last LR (checkpointed apart: older
        checkpoints lack them)."""
        return [self.lr_sum, self.lr_steps, self.lr_first, self.lr_last]

    def record(
        self, combined: TowerGradients, decay_loss: tf.Tensor, batch: int, lr: tf.Tensor
    ) -> tf.Tensor:
        """Add one step of `batch` examples at learning rate `lr`; its total loss: mean
        cross-entropy + the weight decay + the model's own losses (`decay_loss`: the last two)."""
        lr = tf.cast(lr, tf.float32)
        self.lr_first.assign(tf.where(self.lr_steps == 0, lr, self.lr_first))
        self.lr_last.assign(lr)
        self.lr_sum.assign_add(tf.cast(lr, tf.float64))
        self.lr_steps.assign_add(1)
        cross_entropy = combined.cross_entropy_sum / batch
        total = cross_entropy + decay_loss
        self.cross_entropy_sum.assign_add(tf.cast(combined.cross_entropy_sum, tf.float64))
        self.correct.assign_add(combined.correct)
        self.examples.assign_add(batch)
        self.weight_decay_loss.assign(decay_loss)
        self.last_loss.assign(total)
        self.last_cross_entropy.assign(cross_entropy)
        return total

    def reset(self) -> None:
        for accumulator in (*self.sums, *self.lr_sums):
            accumulator.assign(tf.zeros_like(accumulator))

    def read(self) -> dict[str, float]:
        """Mean cross-entropy and accuracy since the last reset, the last step's weight decay,
        and the mean LR of the steps (`lr`) with the first and last step's beside it where they
        differ: a drop shows in the epoch it happens."""
        examples = max(int(self.examples.numpy()), 1)
        cross_entropy = float(self.cross_entropy_sum.numpy()) / examples
        decay_loss = float(self.weight_decay_loss.numpy())
        first, last = float(self.lr_first.numpy()), float(self.lr_last.numpy())
        return {
            "cross_entropy": cross_entropy,
            "weight_decay_loss": decay_loss,
            "total_loss": cross_entropy + decay_loss,
            "train_accuracy": float(self.correct.numpy()) / examples,
            "lr": float(self.lr_sum.numpy()) / max(int(self.lr_steps.numpy()), 1),
            **({"lr_first": first, "lr_last": last} if first != last else {}),
        }

    def last_step(self) -> tuple[float, float]:
        """(cross-entropy, total loss) of the last step (reading waits for it)."""
        return float(self.last_cross_entropy.numpy()), float(self.last_loss.numpy())
