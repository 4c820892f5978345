"""`lr_scaling: adascale` in training: one tower is the plain run bit for bit; four towers end when
tau reaches the reference batch's updates and resume exactly; the configuration's rules."""

import math
import re

import fixtures_model
import numpy as np
import pytest
from pydantic import ValidationError

from towerbench.cli.main import main
from towerbench.config.grid import canonical, with_budget
from towerbench.config.sections import TrainConfig
from towerbench.model import training


class _Killed(Exception):
    pass


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    # 600 training examples: 10 steps of 64 per epoch (the last of 24), 38 of 16.
    return fixtures_model.write_digits(tmp_path_factory.mktemp("data"))


@pytest.mark.slow
def test_one_tower_adascale_is_the_plain_run_bit_for_bit(data_dir):
    common = dict(dataset="digits", towers=1, global_batch=64, reference_batch=64, epochs=2)
    plain = training.train(TrainConfig(**common, lr_scaling="none"), data_dir)
    adascale = training.train(TrainConfig(**common, lr_scaling="adascale"), data_dir)
    assert adascale.final.steps == plain.final.steps == 20
    for with_gain, without in zip(
        adascale.model.get_weights(), plain.model.get_weights(), strict=True
    ):
        np.testing.assert_array_equal(with_gain, without)
    for with_gain, without in zip(adascale.history, plain.history, strict=True):
        assert (with_gain.lr, with_gain.cross_entropy) == (without.lr, without.cross_entropy)
        assert with_gain.test_accuracy == without.test_accuracy
        assert with_gain.adascale_gain == 1.0 and with_gain.adascale_tau == with_gain.step
    assert plain.history[-1].adascale_gain is None


@pytest.mark.slow
def test_four_towers_end_when_tau_reaches_the_reference_updates_and_resume_exactly(
    data_dir, tmp_path, monkeypatch
):
    monkeypatch.setattr(training, "PROGRESS_SECONDS", 0.0)  # progress after every step
    # Reference: 1 tower of 16 for 2 epochs = 2 x 38 = 76 updates; 4 towers of 16: S = 4.
    config = TrainConfig(
        dataset="digits",
        towers=4,
        global_batch=64,
        reference_batch=16,
        lr_scaling="adascale",
        epochs=2,
        checkpoint_every=5,
    )
    straight = training.train(config, data_dir)
    last = straight.history[-1]
    assert 76 / 4 <= straight.final.steps < 76  # gains between 1 and 4, not all 1 or all 4
    assert last.adascale_tau >= 76 > last.adascale_tau - 4  # stopped at the first step past it
    gains = [record.adascale_gain for record in straight.history]
    assert all(1.0 <= gain <= 4.0 for gain in gains)
    assert last.adascale_sigma_sq > 0 and last.adascale_mu_sq > 0
    assert straight.final.test_accuracy > 0.5  # chance is 0.1
    # Its LR: the base LR times the mean gain over the run, tau / updates.
    mean_gain = last.adascale_tau / straight.final.steps
    assert straight.final.effective_lr == pytest.approx(config.base_lr * mean_gain)

    def kill_at(step):
        def progress(metrics):
            if metrics["step"] == step:
                raise _Killed

        return progress

    with pytest.raises(_Killed):  # after the checkpoint at step 10 (epoch 1 ends at step 10)
        training.train(config, data_dir, tmp_path / "ckpt", on_progress=kill_at(12))
    resumed = training.train(config, data_dir, tmp_path / "ckpt")
    assert resumed.final.steps == straight.final.steps
    assert resumed.history[-1].adascale_tau == last.adascale_tau
    for after_resume, uninterrupted in zip(
        resumed.model.get_weights(), straight.model.get_weights(), strict=True
    ):
        np.testing.assert_array_equal(after_resume, uninterrupted)


def test_adascale_with_one_tower_needs_the_reference_batch():
    with pytest.raises(ValidationError, match="adascale measures the gradient variance"):
        TrainConfig(towers=1, global_batch=64, reference_batch=16, lr_scaling="adascale")
    TrainConfig(towers=2, global_batch=64, reference_batch=16, lr_scaling="adascale")


def test_adascale_runs_are_not_stretched_and_have_no_warmup():
    config = TrainConfig(
        towers=4, global_batch=512, epochs=10, warmup_epochs=2, lr_scaling="adascale"
    )
    budgeted = with_budget(config.model_dump(), "updates")
    assert budgeted["epochs"] == 10 and budgeted["warmup_epochs"] == 2
    assert canonical(config).warmup_epochs == 0
    linear = with_budget(config.model_copy(update={"lr_scaling": "linear"}).model_dump(), "updates")
    assert math.isclose(linear["epochs"], 40)


@pytest.mark.slow
def test_cli_train_shows_the_gain_and_tau_each_epoch(data_dir, capsys):
    code = main(
        [
            *("train", "--dataset", "digits", "--towers", "2", "--global-batch", "32"),
            *("--reference-batch", "16", "--lr-scaling", "adascale", "--epochs", "1"),
            *("--data-dir", str(data_dir)),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    epoch_lines = [line for line in out.splitlines() if line.startswith("epoch ")]
    assert epoch_lines and all(
        re.search(r"  gain [12]\.\d\d  tau \d+$", line) for line in epoch_lines
    )
    assert re.search(r"LR [\d.]+ \(base LR 0\.05 x mean gain\)", out)
