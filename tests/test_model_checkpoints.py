"""Checkpoints written before the epoch's LR sums were kept still resume."""

from __future__ import annotations

import tensorflow as tf

from towerbench.config.sections import TrainConfig
from towerbench.model.checkpoints import Checkpoints


def _state(weights: float, with_lr_sums: bool) -> tuple[tf.train.Checkpoint, list[tf.Variable]]:
    values = [tf.Variable(weights), tf.Variable(1.0), tf.Variable(2.0), tf.Variable(3.0)]
    weight, ema, sums, lr_sum = values
    parts = {"weights": [weight], "optimizer": [], "ema": [ema], "metric_sums": [sums]}
    parts["noise"] = tf.Module()
    if with_lr_sums:
        parts["lr_sums"] = [lr_sum]
    return tf.train.Checkpoint(**parts), values


def test_an_older_checkpoint_restores_everything_it_has(tmp_path) -> None:
    config = TrainConfig(checkpoint_every=1)
    older, _ = _state(5.0, with_lr_sums=False)
    checkpoints, history = Checkpoints.open(tmp_path, config, older)
    assert history == []
    checkpoints.save(3, [])
    newer, (weight, ema, sums, lr_sum) = _state(0.0, with_lr_sums=True)
    resumed, _ = Checkpoints.open(tmp_path, config, newer)
    assert float(weight.numpy()) == 5.0  # restored
    assert float(lr_sum.numpy()) == 3.0  # not in the older checkpoint: as it was
    weight.assign(7.0)
    resumed.save(4, [])  # now with the LR sums: every object must match
    again, (weight, *_) = _state(0.0, with_lr_sums=True)
    Checkpoints.open(tmp_path, config, again)
    assert float(weight.numpy()) == 7.0
