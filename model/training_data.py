"""The preprocessed dataset a training run reads, refused with a one-line message naming the
option when it cannot serve the run's settings. Reading it runs no TensorFlow op."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from towerbench.config.sections import TrainConfig
from towerbench.core.errors import TowerbenchError

if TYPE_CHECKING:  # model.tfrecords imports TensorFlow
    from towerbench.model.tfrecords import Manifest


def check_config_against_data(config: TrainConfig, manifest: Manifest) -> None:
    """Refuse settings the dataset cannot satisfy, naming the option."""
    examples = manifest.splits["train"].examples
    height, width, _ = manifest.image_shape
    if config.towers > examples:
        raise TowerbenchError(
            f"--towers {config.towers} exceeds the {examples} training examples of "
            f"{config.dataset!r}: every tower needs at least one example per step"
        )
    if config.global_batch > examples:
        raise TowerbenchError(
            f"--global-batch {config.global_batch} exceeds the {examples} training examples of "
            f"{config.dataset!r}"
        )
    if config.crop_size is not None and config.crop_size > min(height, width):
        raise TowerbenchError(
            f"--crop-size {config.crop_size} is larger than the {height}x{width} images of "
            f"{config.dataset!r} (use a smaller crop or --crop-size none)"
        )
    if "test" not in manifest.splits:
        raise TowerbenchError(f"dataset {config.dataset!r} has no test split to evaluate on")


def load_training_data(
    config: TrainConfig, data_dir: Path
) -> tuple[Manifest, list[str], list[str]]:
    """The manifest and the train and test files of DATA_DIR/tfrecords/<dataset>, checked
    against `config`."""
    from towerbench.model.tfrecords import MANIFEST_NAME, dataset_dir, load_manifest, split_files

    folder = dataset_dir(data_dir, config.dataset)
    if not (folder / MANIFEST_NAME).is_file():
        raise TowerbenchError(
            f"--dataset {config.dataset}: no preprocessed data in {folder}; run "
            f"`towerbench preprocess {config.dataset} --data-dir {data_dir}` first"
        )
    manifest = load_manifest(folder)
    check_config_against_data(config, manifest)
    return manifest, split_files(folder, manifest, "train"), split_files(folder, manifest, "test")
