"""The training loop on a tiny digits set: learning, honest evaluation, exact resume, refusals."""

import json

import fixtures_model
import numpy as np
import pytest

from towerbench.cli.main import main
from towerbench.config.sections import TrainConfig
from towerbench.core.tfrecord_format import dataset_dir, load_manifest
from towerbench.model import evaluation, training
from towerbench.model.records import EpochRecord
from towerbench.model.stability import diverged, instability

pytestmark = pytest.mark.slow  # trains, or starts servers or processes

TEST_EXAMPLES = 103  # not a multiple of any evaluation batch used here


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return fixtures_model.write_digits(tmp_path_factory.mktemp("data"), test=TEST_EXAMPLES)


def _last_json_line(text: str) -> dict:
    return json.loads(text.strip().splitlines()[-1])


def test_cli_training_learns_digits_well_above_chance(data_dir, capsys):
    code = main(
        [
            "train",
            "--dataset",
            "digits",
            "--towers",
            "2",
            "--global-batch",
            "32",
            "--epochs",
            "4",
            "--data-dir",
            str(data_dir),
            "--json",
        ]
    )
    captured = capsys.readouterr()
    summary = json.loads(captured.out)  # --json: the document alone on stdout
    assert code == 0 and summary["status"] == "completed"
    assert summary["test_accuracy"] > 0.5  # chance is 0.1
    assert summary["device_kind"] == "logical CPU" and len(summary["device_names"]) == 2
    assert summary["global_batch"] == 32 and summary["effective_lr"] == pytest.approx(0.05)
    assert summary["config"]["crop_size"] is None  # the digits preset, shown resolved
    assert "presets for tutorial/digits" in captured.err and "epoch   4.00" in captured.err
    for key in ("ema_test_accuracy", "images_per_sec", "noise_scale"):
        assert key in summary


def test_every_test_example_is_evaluated_exactly_once(data_dir, monkeypatch):
    monkeypatch.setattr(evaluation, "EVAL_BATCH", 16)  # 103 = 6 x 16 + 7: a padded last batch
    config = TrainConfig(dataset="digits", towers=4, global_batch=64, epochs=0.5)
    result = training.train(config, data_dir)
    manifest = load_manifest(dataset_dir(data_dir, "digits"))
    assert result.final.test_examples == TEST_EXAMPLES
    assert result.confusion_matrix.sum(axis=1).tolist() == manifest.splits["test"].per_class
    # The recorded weight decay term against one recomputed from the trained weights: the
    # tutorial's weight_decay * l2_loss of local3's and local4's kernels (the last step, taken at
    # the weights before it, moves it by a fraction of a per cent).
    kernels = [result.model.get_layer(name).kernel.numpy() for name in ("local3", "local4")]
    recomputed = config.l2_weight_decay * sum(float(np.sum(k**2)) / 2 for k in kernels)
    assert result.history[-1].weight_decay_loss == pytest.approx(recomputed, rel=0.01)


class _Killed(Exception):
    pass


@pytest.mark.parametrize(
    "optimizer",
    [
        {},  # the digits preset's momentum
        # Adam's moments and step count, under the square-root rule's betas and epsilon.
        {"optimizer": "adam", "lr_scaling": "sqrt", "reference_batch": 32},
    ],
    ids=["momentum", "adam"],
)
def test_resumed_run_ends_with_the_same_weights_as_an_uninterrupted_one(
    data_dir, tmp_path, monkeypatch, optimizer
):
    monkeypatch.setattr(training, "PROGRESS_SECONDS", 0.0)  # progress after every step
    # 600 examples in batches of 64: 10 steps per epoch (the last one has 24 examples).
    config = TrainConfig(
        dataset="digits",
        towers=2,
        global_batch=64,
        epochs=2,
        checkpoint_every=5,
        seed=5,
        **optimizer,
    )
    uninterrupted = training.train(config, data_dir)

    def kill_at(step):
        def progress(metrics):
            if metrics["step"] == step:
                raise _Killed

        return progress

    # Killed after the checkpoint at the end of epoch 1, then after the one in mid-epoch 2.
    for kill_step in (12, 17):
        with pytest.raises(_Killed):
            training.train(config, data_dir, tmp_path / "ckpt", on_progress=kill_at(kill_step))
    resumed = training.train(config, data_dir, tmp_path / "ckpt")
    assert resumed.final.steps == uninterrupted.final.steps == 20
    for after_resume, straight in zip(
        resumed.model.get_weights(), uninterrupted.model.get_weights(), strict=True
    ):
        np.testing.assert_array_equal(after_resume, straight)
    assert [e.step for e in resumed.history] == [10.0, 20.0]
    assert resumed.history[-1].train_accuracy == uninterrupted.history[-1].train_accuracy


def test_exploding_loss_stops_the_run_as_diverged(data_dir, monkeypatch):
    monkeypatch.setattr(training, "PROGRESS_SECONDS", 0.0)
    config = TrainConfig(
        dataset="digits", towers=1, global_batch=64, epochs=3, base_lr=1e4, divergence_factor=2
    )
    result = training.train(config, data_dir)
    assert result.status == "diverged"
    assert result.final.steps < 30


def test_tutorial_bn_with_nesterov_and_linear_decay_learns_and_reports_its_losses(data_dir):
    config = TrainConfig(
        dataset="digits",
        model="tutorial_bn",
        towers=2,
        global_batch=64,
        epochs=4,
        base_lr=0.02,
        optimizer="nesterov",
        decay="linear",
        lr_scaling="linear",
        reference_batch=32,
        warmup_epochs=1,
    )
    result = training.train(config, data_dir)
    final = result.final
    assert result.status == "completed" and final.unstable is None
    assert final.test_accuracy > 0.5  # chance is 0.1
    assert final.effective_lr == pytest.approx(0.04)
    # Linear decay from 0.04 after 1 warmup epoch to 0 at epoch 4, 10 steps an epoch: the last
    # epoch's steps used the LR at epochs 3.0 ... 3.9; its mean is at epoch 3.45.
    decayed = [0.04 * (1 - (epoch - 1) / 3) for epoch in (3.0, 3.45, 3.9)]
    last_epoch = result.history[-1]
    assert (last_epoch.lr_first, last_epoch.lr, last_epoch.lr_last) == pytest.approx(decayed)
    last = result.history[-1]
    assert final.train_cross_entropy == last.cross_entropy
    assert final.train_total_loss == pytest.approx(
        final.train_cross_entropy + final.train_weight_decay_loss
    )
    assert final.generalization_gap == pytest.approx(
        final.test_cross_entropy - final.train_cross_entropy
    )
    assert 0 < final.test_cross_entropy < np.log(10)


@pytest.mark.parametrize(
    ("losses", "accuracy", "reason"),
    [
        ([2.0, 1.0, 0.5], 0.9, None),
        ([4.4, 2.1, 2.0], 0.226, "training cross-entropy reached 4.40 in epoch 1, above chance"),
        ([2.2, 2.28, 2.29], 0.15, "test accuracy 15.0% is near chance (10%) and the training"),
        ([2.3, 2.25, 2.2], 0.15, None),  # short, but learning
        ([float("nan")], 0.1, "training cross-entropy reached nan"),
    ],
)
def test_instability_is_named_relative_to_chance(losses, accuracy, reason):
    history = [_epoch_record(index + 1, loss) for index, loss in enumerate(losses)]
    found = instability(history, 10, accuracy)
    assert found == reason if reason is None else found.startswith(reason)


def _epoch_record(epoch: int, cross_entropy: float) -> EpochRecord:
    nan = float("nan")
    return EpochRecord(
        epoch=float(epoch),
        step=10 * epoch,
        lr=0.1,
        cross_entropy=cross_entropy,
        weight_decay_loss=nan,
        total_loss=nan,
        train_accuracy=nan,
        images_per_sec=nan,
        step_time=nan,
        wall_time=nan,
    )


@pytest.mark.parametrize(
    ("cross_entropy", "total_loss", "expected"),
    [
        (2.3, 2.7, False),  # chance level for 10 classes: ln 10 = 2.30
        (6.9, 7.3, False),  # just under 3 x chance
        (7.0, 7.4, True),
        (1.0, float("inf"), True),
        (float("nan"), 1.0, True),
    ],
)
def test_divergence_is_relative_to_chance(cross_entropy, total_loss, expected):
    assert diverged(cross_entropy, total_loss, classes=10, factor=3) is expected


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--towers", "0"], "--towers: Input should be greater than or equal to 1"),
        (
            ["--towers", "3", "--global-batch", "128"],
            "--global-batch: 128 is not divisible by --towers 3",
        ),
        (["--towers", "1000", "--global-batch", "1000"], "--towers 1000 exceeds the 600 training"),
        (["--global-batch", "1024"], "--global-batch 1024 exceeds the 600 training examples"),
        (["--crop-size", "12"], "--crop-size 12 is larger than the 8x8 images"),
        (["--aggregation", "avg"], "--aggregation: Input should be 'mean' or 'sum'"),
        (["--dataset", "absent"], "run `towerbench preprocess absent"),
    ],
)
def test_bad_parameters_are_refused_with_a_one_line_message(data_dir, capsys, arguments, message):
    code = main(["train", "--dataset", "digits", "--data-dir", str(data_dir), *arguments])
    error = capsys.readouterr().err.strip()
    assert code == 2
    assert error.startswith("towerbench train: error: ") and message in error
    assert "\n" not in error and "Traceback" not in error


def test_gradcheck_command_prints_the_json_of_issue_3(capsys):
    assert main(["gradcheck", "--towers", "2", "--global-batch", "8", "--json"]) == 0
    result = _last_json_line(capsys.readouterr().out)
    assert result["model"] == "tutorial" and result["towers"] == 2
    assert result["global_batch"] == 8
    assert result["mean_vs_single"]["max_rel_diff"] <= 1e-5
    assert result["mirrored_vs_single"]["max_rel_diff"] <= 1e-5
    assert result["sum_vs_mean"]["ratio"] == pytest.approx(2.0)
