"""Every optimizer trains the digits with 1 and 2 towers, and an Adam run resumes exactly."""

from __future__ import annotations

import fixtures_model
import numpy as np
import pytest

from towerbench.config.optimizers import OPTIMIZERS
from towerbench.config.sections import TrainConfig
from towerbench.model import training

pytestmark = pytest.mark.slow  # trains

# An LR and epochs that learn 600 digits at batch 32 (measured here: 43% for LARS, whose
# trust ratios move the tutorial network slowly, 83% to 99% for the others).
LEARNING_RATES = {
    "sgd": 0.3,
    "momentum": 0.05,
    "nesterov": 0.05,
    "lars": 10.0,
    "adam": 0.001,
    "adamw": 0.001,
    "rmsprop": 0.001,
    "lamb": 0.01,
}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return fixtures_model.write_digits(tmp_path_factory.mktemp("data"))


@pytest.mark.parametrize("towers", [1, 2])
@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_every_optimizer_learns_the_digits(data_dir, optimizer: str, towers: int) -> None:
    config = TrainConfig(
        dataset="digits",
        optimizer=optimizer,
        base_lr=LEARNING_RATES[optimizer],
        towers=towers,
        global_batch=32,
        reference_batch=32,
        epochs=8 if optimizer == "lars" else 4,
        eval_every_epochs=8,
    )
    result = training.train(config, data_dir)
    assert result.status == "completed"
    assert result.final.test_accuracy > 0.3, (optimizer, result.final.test_accuracy)  # chance 0.1


class _Killed(Exception):
    pass


def test_a_resumed_adam_run_ends_with_the_weights_of_an_uninterrupted_one(
    data_dir, tmp_path, monkeypatch
):
    """Adam's moments and step count are restored bit for bit from the checkpoint."""
    monkeypatch.setattr(training, "PROGRESS_SECONDS", 0.0)  # progress after every step
    config = TrainConfig(
        dataset="digits",
        optimizer="adam",
        towers=2,
        global_batch=64,
        epochs=2,
        checkpoint_every=5,
        seed=5,
        lr_scaling="sqrt",
        reference_batch=32,  # the square-root rule's betas and epsilon in the checkpoint too
    )
    uninterrupted = training.train(config, data_dir)

    def kill_at_step_12(metrics):
        if metrics["step"] == 12:
            raise _Killed

    with pytest.raises(_Killed):
        training.train(config, data_dir, tmp_path / "ckpt", on_progress=kill_at_step_12)
    resumed = training.train(config, data_dir, tmp_path / "ckpt")
    assert resumed.final.steps == uninterrupted.final.steps == 20
    for after_resume, straight in zip(
        resumed.model.get_weights(), uninterrupted.model.get_weights(), strict=True
    ):
        np.testing.assert_array_equal(after_resume, straight)
