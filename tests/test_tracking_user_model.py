"""A user's model in MLflow and sweeps: its function and file digest as run params, its summary as
an artifact, its function (not its folder) in labels, and a new sweep when the file changes."""

from __future__ import annotations

import hashlib
from pathlib import Path

import fixtures_model
import pytest
from mlflow.tracking import MlflowClient

from towerbench.config.grid import expand, group_name
from towerbench.config.load import load
from towerbench.config.params import TrackingConfig
from towerbench.config.sections import TrainConfig
from towerbench.config.tracking_uri import resolve_tracking
from towerbench.tasks.tracking import create_config_run, ensure_experiment, sweep_key
from towerbench.tasks.training.train import run_training_process
from towerbench.tasks.training.worker import WorkerRequest

NET = """
import keras

def build(input_shape, num_classes):
    inputs = keras.Input(shape=input_shape)
    x = keras.layers.Conv2D(4, 3, kernel_regularizer=keras.regularizers.L2(1e-4))(inputs)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(num_classes)(x), name="tiny")
"""


def test_a_swept_model_list_is_labelled_by_function_and_keyed_by_file_content(tmp_path):
    (tmp_path / "nets").mkdir()
    net = tmp_path / "nets" / "tiny.py"
    net.write_text(NET)
    params = tmp_path / "params.yaml"
    params.write_text(
        "train: {global_batch: 32}\n"
        "sweep:\n  towers: [1]\n  seeds: [0]\n  grid: {model: [tutorial, nets/tiny.py:build]}\n"
    )
    loaded = load(params, resolve_tracking=False)
    runs = expand(loaded.train, loaded.sweep)
    assert [run.model for run in runs] == ["tutorial", f"{net}:build"]
    assert [group_name(run, ["model"]) for run in runs] == [
        "towers=1 agg=mean lr=linear warmup=0 model=tutorial",
        "towers=1 agg=mean lr=linear warmup=0 model=tiny:build",
    ]
    before = sweep_key(runs, ["v1"], "sweep")
    assert sweep_key(runs, ["v1"], "sweep") == before
    net.write_text(NET.replace("Conv2D(4", "Conv2D(8"))
    assert sweep_key(runs, ["v1"], "sweep") != before  # an edited model: not the old sweep


@pytest.mark.slow
def test_a_training_process_logs_the_models_provenance_and_summary(tmp_path):
    data_dir = fixtures_model.write_digits(tmp_path / "data", train=64, test=32, shards=1)
    net = tmp_path / "tiny.py"
    net.write_text(NET)
    tracking = resolve_tracking(TrackingConfig(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}"))
    experiment_id = ensure_experiment(tracking, "user-model")
    config = TrainConfig(dataset="digits", model=f"{net}:build", global_batch=32, epochs=1)
    parent = MlflowClient(tracking.tracking_uri).create_run(experiment_id).info.run_id
    run_id = create_config_run(tracking, experiment_id, parent, config, "tiny", "g", "v1")
    request = WorkerRequest(
        config=config,
        data_dir=Path(data_dir),
        tracking_uri=tracking.tracking_uri,
        run_id=run_id,
        data_version="v1",
    )
    result = run_training_process(request, on_event=lambda event: None)
    assert result.status == "completed", result
    client = MlflowClient(tracking.tracking_uri)
    params = client.get_run(run_id).data.params
    assert params["model_function"] == "build"
    assert params["model_digest"] == hashlib.sha256(NET.encode()).hexdigest()
    summary = Path(client.download_artifacts(run_id, "model_summary.txt", str(tmp_path)))
    text = summary.read_text()
    assert "tiny" in text and "Total params" in text
