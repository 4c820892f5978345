"""Data that goes bad while a run trains (issue 29): a shard damaged or deleted mid-run is one
line naming it (`train`: exit 2, no traceback); `report` on a sweep still running says so."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import fixtures_model
import pytest
from mlflow.tracking import MlflowClient

from towerbench.cli.main import main
from towerbench.config.params import TrackingConfig
from towerbench.config.sections import TrainConfig
from towerbench.core.errors import TowerbenchError
from towerbench.core.outcome import Status
from towerbench.core.tfrecord_format import dataset_dir, load_manifest
from towerbench.model import training
from towerbench.tasks import tracking

pytestmark = pytest.mark.slow  # trains, or starts servers or processes

TWO_EPOCHS = TrainConfig(dataset="digits", global_batch=32, epochs=2, crop_size=None)


def _data(folder: Path) -> tuple[Path, Path]:
    """A small digits set; (data dir, its dataset folder)."""
    data = fixtures_model.write_digits(folder, train=240, test=80)
    return data, dataset_dir(data, "digits")


def _flip_a_byte(shard: Path) -> bytes:
    damaged = bytearray(shard.read_bytes())
    damaged[len(damaged) // 2] ^= 0xFF
    shard.write_bytes(bytes(damaged))
    return bytes(damaged)


@pytest.mark.parametrize(
    ("split", "harm", "expected"),
    [
        ("train", _flip_a_byte, "is damaged: its sha256 is not the one manifest.json lists"),
        ("test", Path.unlink, "listed in manifest.json is missing"),
    ],
)
def test_a_shard_harmed_while_training_is_named_in_one_line(tmp_path, split, harm, expected):
    data, folder = _data(tmp_path)
    shard = folder / load_manifest(folder).splits[split].files[1].path

    def after_the_first_epoch(record) -> None:
        if record.epoch == 1:
            harm(shard)

    with pytest.raises(TowerbenchError) as failed:
        training.train(TWO_EPOCHS, data, on_epoch=after_the_first_epoch)
    message = str(failed.value)
    assert message.startswith(f"{shard}: TFRecord shard {expected} (while training: ")
    assert "`towerbench preprocess digits`" in message and "\n" not in message


def test_a_dataset_replaced_under_its_training_is_said_in_one_line(tmp_path):
    """Another version swapped in (3 shards where it read 2; no lock of ours was asked): the
    shard it reads is gone, every shard of the new version is there."""
    data, folder = _data(tmp_path / "run")

    def after_the_first_epoch(record) -> None:
        if record.epoch == 1:
            rebuilt = fixtures_model.write_digits(tmp_path / "new", train=240, test=80, shards=3)
            shutil.rmtree(folder)
            dataset_dir(rebuilt, "digits").rename(folder)

    with pytest.raises(TowerbenchError) as failed:
        training.train(TWO_EPOCHS, data, on_epoch=after_the_first_epoch)
    message = str(failed.value)
    assert message.startswith(f"{folder}: the dataset was replaced while this run read it (")
    assert "\n" not in message


def test_train_stops_on_a_damaged_record_with_exit_2_and_one_line(tmp_path, capsys):
    """Damage its digest cannot show (the shard was damaged before it was hashed): only reading
    finds it, and the command still names the shard."""
    data, folder = _data(tmp_path)
    manifest = json.loads((folder / "manifest.json").read_text())
    entry = manifest["splits"]["train"]["files"][0]
    entry["sha256"] = hashlib.sha256(_flip_a_byte(folder / entry["path"])).hexdigest()
    (folder / "manifest.json").write_text(json.dumps(manifest))

    argv = ["train", "--global-batch", "32", "--epochs", "2", "--data-dir", str(data)]
    assert main(argv) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith(
        f"towerbench train: error: {folder / entry['path']}: TFRecord shard is damaged "
        "(corrupted record at "
    )
    assert "Traceback" not in capsys.readouterr().err


def test_report_on_a_sweep_still_running_says_so_and_marks_the_report_partial(tmp_path):
    settings = TrackingConfig(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = tracking.ensure_experiment(settings, "running")
    parent = tracking.start_sweep_run(
        settings, experiment, "sweep digits", "sweep", {}, swept=[], key="k"
    )
    for towers in (1, 2):
        config = TrainConfig(towers=towers, global_batch=32)
        run_id = tracking.create_config_run(
            settings, experiment, parent, config, f"towers={towers}", f"towers={towers}", "v"
        )
        if towers == 1:  # one configuration ended, the other still trains
            client = MlflowClient(settings.tracking_uri)
            for epoch in (1, 2):
                client.log_metric(run_id, "epoch", epoch, step=epoch)
                client.log_metric(run_id, "wall_time", epoch, step=epoch)
                client.log_metric(run_id, "test_accuracy", 0.5 + epoch / 10, step=epoch)
            tracking.set_tags(settings, run_id, {tracking.STATUS_TAG: Status.COMPLETED})
            client.set_terminated(run_id)

    # In a process of its own, as users run it (Prefect's logging set-up, once TensorFlow's is
    # there, would close this process's captured stderr).
    argv = ["report", "--sweep", parent, "--tracking-uri", settings.tracking_uri]
    argv += ["--report-dir", str(tmp_path / "reports")]
    completed = subprocess.run(
        [sys.executable, "-m", "towerbench.cli.main", *argv],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    said = [line for line in completed.stderr.splitlines() if line.startswith("towerbench")]
    assert len(said) == 1, completed.stderr[-3000:]
    assert said[0].startswith(f"towerbench report: sweep {parent} is still running")
    assert "covers the 1 run(s) ended so far" in said[0]
    report = Path(completed.stdout.strip().splitlines()[-1]).read_text()
    assert f"**Partial report:** sweep {parent} is still running" in report
