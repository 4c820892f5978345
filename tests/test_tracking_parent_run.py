"""A sweep's MLflow parent run describes the sweep: its lists, the values every run shares, the
axes it varies, and the dataset it trains on (real MLflow on SQLite; nothing trains)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from towerbench.config.grid import expand
from towerbench.config.params import SweepGrid, TrackingConfig
from towerbench.config.sections import TrainConfig
from towerbench.core.tfrecord_format import Manifest, SplitInfo, dataset_dir
from towerbench.flows.sweep import open_sweep, plan_sweep
from towerbench.tasks.tracking import SWEPT_TAG, swept_besides_axes

pytestmark = pytest.mark.slow  # creates an MLflow store (its schema takes 10-20 s to create)


def write_manifest(data_dir: Path, name: str) -> None:
    """The manifest of a (shard-less) dataset: all the sweep's bookkeeping reads."""
    folder = dataset_dir(data_dir, name)
    folder.mkdir(parents=True)
    split = SplitInfo(examples=1, per_class=[1], files=[])
    manifest = Manifest(
        dataset=name,
        classes=["0"],
        image_shape=[8, 8, 1],
        splits={"train": split},
        mean=[0.0],
        std=[1.0],
        source={},
    )
    (folder / "manifest.json").write_text(manifest.model_dump_json())


def test_the_parent_run_describes_the_sweep(tmp_path) -> None:
    data_dir = tmp_path / "data"
    write_manifest(data_dir, "digits")
    tracking = TrackingConfig(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    train = TrainConfig(dataset="digits", epochs=2, reference_batch=32)
    sweep = SweepGrid(towers=[1, 2], seeds=[0], per_tower_batch=32, warmup_epochs=[1])
    configs = expand(train, sweep)
    plan = plan_sweep(configs, train, sweep, data_dir, None, "sweep")

    opened = open_sweep(tracking, plan, train, sweep, "sweep", fresh=True)

    parent = MlflowClient(tracking.tracking_uri).get_run(opened.parent_run_id)
    params = parent.data.params
    assert json.loads(params["sweep.towers"]) == [1, 2]
    assert json.loads(params["sweep.seeds"]) == [0]
    assert params["sweep.per_tower_batch"] == "32" and params["train.epochs"] == "2.0"
    # What each run sets for itself is not one configuration's value on the parent.
    for per_run in ("train.towers", "train.global_batch", "train.seed", "train.lr_scaling"):
        assert per_run not in params
    assert "None" not in params.values() and not any(key.startswith("sweep.grid") for key in params)
    assert json.loads(parent.data.tags[SWEPT_TAG]) == ["towers"]
    assert swept_besides_axes(parent) == []  # what the report adds to run names
    (data,) = parent.inputs.dataset_inputs
    assert data.dataset.name == "digits" and data.dataset.digest == plan.versions["digits"][-32:]
