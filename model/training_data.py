"""The preprocessed dataset a training run reads, refused with a one-line message naming the
option when it cannot serve the run's settings, or naming the shard that is damaged or gone.
Checking it runs no TensorFlow op; a shard that fails while training is named by `read_failure`.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from towerbench.config.losses import EMBEDDING_PAIRS, labels_taken
from towerbench.config.metrics import recall_cutoff, resolved_metric
from towerbench.config.model_ref import parse_model
from towerbench.config.sections import TrainConfig
from towerbench.core.errors import TowerbenchError
from towerbench.core.tfrecord_format import (
    MANIFEST_NAME,
    Manifest,
    dataset_dir,
    load_manifest,
    shard_error,
    shard_problem,
    split_files,
    verify_shards,
)


def distortions_note(config: TrainConfig, data_dir: Path) -> str | None:
    """For the configuration's echo: that crops, flips and colour distortions are off because
    the preprocessed dataset holds no uint8 images (None for images: they apply as configured)."""
    features = load_manifest(dataset_dir(data_dir, config.dataset)).features
    if features.is_image:
        return None
    return (
        f"input: {config.dataset!r} holds {features.describe()}: crops, flips and colour "
        "distortions are off (they apply to uint8 images (H, W, 1 or 3) only)"
    )


def _check_network_takes(config: TrainConfig, manifest: Manifest) -> None:
    """A built-in network is a CNN over (H, W, C): other data needs the user's own model."""
    features = manifest.features
    if parse_model(config.model).builtin and len(features.shape) != 3:
        raise TowerbenchError(
            f"--model {config.model}: a built-in network takes images (H, W, C), "
            f"{config.dataset!r} holds {features.describe()}; pass your own model "
            "(--model path/to/file.py:build)"
        )


_LABELS_NAMED = {"class_ids": "class ids", "rows": "label rows"}


def refuse_built_in_pairs(config: TrainConfig) -> None:
    """in_batch_softmax takes the user's model's (batch, 2, d): a built-in network is refused."""
    if config.loss in EMBEDDING_PAIRS and parse_model(config.model).builtin:
        raise TowerbenchError(
            f"--loss {config.loss} needs your own model returning (batch, 2, d), a query's "
            f"embedding and its candidate's; --model {config.model} returns class logits"
        )


def _check_loss_takes(config: TrainConfig, manifest: Manifest) -> None:
    """The loss takes the dataset's labels (class ids or rows), and the metric fits the loss."""
    refuse_built_in_pairs(config)
    if config.cross_tower == "gather" and config.loss not in EMBEDDING_PAIRS:
        raise TowerbenchError(
            f"--cross-tower gather applies to in_batch_softmax; --loss {config.loss} is a mean "
            "over examples, which averaged towers already compute exactly"
        )
    if config.cross_tower == "gather" and config.xla:
        raise TowerbenchError(
            "--cross-tower gather with --xla: the gathering forward pass is not compiled, so "
            "XLA's training pass would draw other dropout masks than it; train without --xla"
        )
    if config.cross_tower == "gather" and config.lr_scaling == "adascale":
        raise TowerbenchError(
            "--cross-tower gather with --lr-scaling adascale: AdaScale's gain needs each "
            "tower's gradient of its own small batch, and a gathered tower's is its share of the "
            "batch's; use linear or sqrt"
        )
    takes = labels_taken(config.loss, manifest.labels)
    if takes != manifest.labels:
        holds = (
            f"label rows of {len(manifest.classes)} column{'s' * (len(manifest.classes) != 1)}"
            if manifest.labels == "rows"
            else "class ids"
        )
        fits = (
            "categorical_crossentropy (one-hot or soft rows), binary_crossentropy (0/1 rows) or "
            "mse, mae, huber (targets)"
            if manifest.labels == "rows"
            else "sparse_categorical_crossentropy"
        )
        if manifest.labels == "rows" and len(manifest.classes) == 1:
            fits = (
                "mse, mae or huber (a target column: class ids given as floats are read so; "
                "give them as integers, y.astype(int))"
            )
        raise TowerbenchError(
            f"--loss {config.loss} takes {_LABELS_NAMED[takes]}, {config.dataset!r} holds "
            f"{holds}: use {fits}"
        )
    try:
        metric = resolved_metric(config.metric, config.loss, manifest.labels)
    except ValueError as error:
        raise TowerbenchError(str(error)) from None
    cutoff = recall_cutoff(metric)
    if cutoff is not None and cutoff >= config.eval_candidates:
        raise TowerbenchError(
            f"--metric {metric} ranks each query among --eval-candidates "
            f"{config.eval_candidates}: every query would find its own; give more candidates "
            f"than {cutoff}"
        )
    if manifest.labels == "rows" and len(manifest.classes) < 2 and metric == "accuracy":
        raise TowerbenchError(
            f"--loss {config.loss}: {config.dataset!r} holds label rows of 1 column, and a class "
            "per example needs 2 columns or more (float labels are read as target columns: "
            "give class ids as integers, y.astype(int), for sparse_categorical_crossentropy)"
        )
    _check_row_values(config, manifest)


def _check_row_values(config: TrainConfig, manifest: Manifest) -> None:
    """Label rows hold what the loss and metric need: rows summing to 1 for
    categorical_crossentropy, values in [0, 1] for binary_crossentropy and the 0/1 metrics."""
    if manifest.labels != "rows" or manifest.label_bounds is None:
        return
    low, high = manifest.label_bounds
    if config.loss == "categorical_crossentropy" and not manifest.rows_sum_to_one:
        raise TowerbenchError(
            f"--loss categorical_crossentropy takes rows that sum to 1 (one-hot or soft "
            f"classes), {config.dataset!r} has rows that do not: binary_crossentropy takes "
            "multi-hot tags, mse, mae, huber take targets"
        )
    zero_one = config.loss == "binary_crossentropy" or config.metric in ("binary_accuracy", "auc")
    if zero_one and (low < 0 or high > 1):
        needs = f"--loss {config.loss}" if config.metric == "auto" else f"--metric {config.metric}"
        raise TowerbenchError(
            f"{needs} takes labels in [0, 1], {config.dataset!r} holds values from {low:g} to "
            f"{high:g}: mse, mae, huber take targets"
        )


def _refuse_two_metrics(judged: dict[str, TrainConfig]) -> None:
    """A sweep's report compares one metric: configurations judged by two are refused."""
    if len(judged) > 1:
        named = " and ".join(f"{metric} (--loss {c.loss})" for metric, c in judged.items())
        raise TowerbenchError(
            f"the sweep's configurations are judged by {named}: a report compares one metric; "
            "sweep losses judged by the same metric, or set --metric"
        )


def check_config_against_data(config: TrainConfig, manifest: Manifest) -> None:
    """Refuse settings the dataset cannot satisfy, naming the option."""
    examples = manifest.splits["train"].examples
    _check_network_takes(config, manifest)
    _check_loss_takes(config, manifest)
    if config.towers > examples:
        raise TowerbenchError(
            f"--towers {config.towers} exceeds the {examples} training examples of "
            f"{config.dataset!r}: every tower needs at least one example per step"
        )
    if config.global_batch > examples:
        raise TowerbenchError(
            f"--global-batch {config.global_batch} exceeds the {examples} training examples of "
            f"{config.dataset!r}: the train split must hold at least one global batch"
        )
    crop = config.crop_size if manifest.features.is_image else None  # other data is fed whole
    if crop is not None and crop > min(manifest.image_shape[:2]):
        height, width, _ = manifest.image_shape
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
    folder = dataset_dir(data_dir, config.dataset)
    if not (folder / MANIFEST_NAME).is_file():
        raise TowerbenchError(
            f"--dataset {config.dataset}: no preprocessed data in {folder}; run "
            f"`towerbench preprocess {config.dataset} --data-dir {data_dir}` first"
        )
    manifest = load_manifest(folder)
    check_config_against_data(config, manifest)
    return manifest, split_files(folder, manifest, "train"), split_files(folder, manifest, "test")


def judged_metric(configs: Iterable[TrainConfig], data_dir: Path) -> str:
    """The metric every configuration is judged by (train.metric resolved on its dataset's
    labels); two metrics are refused in one line (a sweep's report compares one)."""
    judged: dict[str, TrainConfig] = {}
    for config in configs:
        labels = load_manifest(dataset_dir(data_dir, config.dataset)).labels
        try:
            metric = resolved_metric(config.metric, config.loss, labels)
        except ValueError as error:
            raise TowerbenchError(str(error)) from None
        judged.setdefault(metric, config)
    _refuse_two_metrics(judged)
    return next(iter(judged), "accuracy")


def check_training_data(configs: Iterable[TrainConfig], data_dir: Path) -> None:
    """What a run checks before it starts (before TensorFlow loads): each configuration's
    dataset is there and suits it, all are judged by one metric (judged_metric), and every
    shard has its manifest's sha256 (each dataset is hashed once)."""
    verified: set[str] = set()
    for config in (configs := list(configs)):
        manifest, _, _ = load_training_data(config, data_dir)
        if config.dataset not in verified:
            verify_shards(dataset_dir(data_dir, config.dataset), manifest)
            verified.add(config.dataset)
    judged_metric(configs, data_dir)


def _tensorflow_detail(error: Exception) -> str:
    """`corrupted record at 19924` from TensorFlow's message (without the op and function)."""
    text = " ".join(str(getattr(error, "message", error)).split())
    text = text.split("}} ", 1)[-1]  # "{{function_node ...}} corrupted record at 19924 [Op:..."
    return text.split(" [Op:", 1)[0][:200]


def _unreadable_shard(folder: Path, manifest: Manifest) -> Path | None:
    """The first shard TensorFlow cannot read to its end (its sha256 may still match: damaged
    before preprocessing hashed it), or None."""
    import tensorflow as tf

    for split in manifest.splits.values():
        for shard in split.files:
            try:
                for _ in tf.data.TFRecordDataset(str(folder / shard.path)):
                    pass
            except tf.errors.DataLossError:
                return folder / shard.path
    return None


def read_failure(error: Exception, config: TrainConfig, data_dir: Path) -> TowerbenchError | None:
    """The one-line error for TensorFlow failing to read the dataset while training (a shard
    damaged: DataLossError; deleted or moved: NotFoundError), naming the shard; None for any
    other error."""
    import tensorflow as tf

    if not isinstance(error, tf.errors.DataLossError | tf.errors.NotFoundError):
        return None
    folder = dataset_dir(data_dir, config.dataset)
    detail = _tensorflow_detail(error)
    try:
        manifest = load_manifest(folder)
    except TowerbenchError as gone:  # the whole folder went away
        return TowerbenchError(f"{gone} (while training: {detail})")
    problem = shard_problem(folder, manifest)
    if problem is not None:
        path, what = problem
        return shard_error(path, f"{what} (while training: {detail})", config.dataset)
    if not isinstance(error, tf.errors.DataLossError):
        if str(folder) in str(error):  # its shards all there: another version replaced this one
            return TowerbenchError(
                f"{folder}: the dataset was replaced while this run read it (while training: "
                f"{detail}): run it again, on the new version"
            )
        return None  # a file that is not one of the dataset's
    damaged = _unreadable_shard(folder, manifest)
    if damaged is not None:
        return shard_error(damaged, f"is damaged ({detail})", config.dataset)
    return TowerbenchError(f"{folder}: a TFRecord shard could not be read ({detail})")
