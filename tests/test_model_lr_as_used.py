"""The per-epoch `lr` is the mean LR of the epoch's steps, with its first and last step's beside
it where they differ: a piecewise drop shows in the epoch where the steps took it (issue 63)."""

import fixtures_model
import pytest

from towerbench.config.sections import TrainConfig
from towerbench.model import training

pytestmark = pytest.mark.slow

BASE_LR, FACTOR, BOUNDARY = 0.1, 0.1, 1.5
STEPS_PER_EPOCH = 10  # 600 examples in batches of 64: the last one has 24


def _lr_at(step: int) -> float:
    """The schedule at the step (counted before it), in epochs of STEPS_PER_EPOCH steps."""
    return BASE_LR * (FACTOR if step / STEPS_PER_EPOCH >= BOUNDARY else 1.0)


def test_the_epoch_lr_is_the_mean_of_the_lr_its_steps_used(tmp_path):
    data_dir = fixtures_model.write_digits(tmp_path, test=50)
    config = TrainConfig(
        dataset="digits",
        global_batch=64,
        epochs=3,
        base_lr=BASE_LR,
        decay="piecewise",
        decay_factor=FACTOR,
        decay_boundaries=[BOUNDARY],
    )
    history = training.train(config, data_dir).history
    for epoch, record in enumerate(history):
        used = [_lr_at(step) for step in range(epoch * STEPS_PER_EPOCH, record.step)]
        assert record.lr == pytest.approx(sum(used) / len(used), rel=1e-6)
        if used[0] == used[-1]:
            assert (record.lr_first, record.lr_last) == (None, None)
        else:
            assert record.lr_first == pytest.approx(used[0], rel=1e-6)
            assert record.lr_last == pytest.approx(used[-1], rel=1e-6)
    # The drop sits in the second epoch: half its steps before the boundary, half after.
    assert [record.lr for record in history] == pytest.approx([0.1, 0.055, 0.01], rel=1e-6)
