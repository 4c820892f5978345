"""Images/s of the training input pipeline (model/input_pipeline.py), every distortion on."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path

from towerbench.config.sections import TrainConfig
from towerbench.core.tfrecord_format import load_manifest, split_files
from towerbench.model.input_pipeline import Distortions, EpochPlan, train_dataset
from towerbench.speed.timing import time_once


def pipeline_runner(
    dataset_folder: Path, global_batch: int, config: TrainConfig
) -> Callable[[], float]:
    """A callable reading one whole training epoch (a new shuffle each call); seconds per image.

    The epoch includes filling the shuffle buffer, as every training epoch does.
    """
    manifest = load_manifest(dataset_folder)
    files = split_files(dataset_folder, manifest, "train")
    plan = EpochPlan(manifest.splits["train"].examples, global_batch, towers=1)
    distortions = Distortions.from_config(config)
    epochs = itertools.count()

    def run() -> float:
        batches = train_dataset(
            files, manifest.features, plan, distortions, config.seed, next(epochs)
        )

        def drain() -> None:
            for _images, _labels in batches:
                pass

        return time_once(drain) / plan.used_examples

    return run
