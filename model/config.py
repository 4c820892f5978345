"""Typed configuration: the one source of truth for the CLI, the Prefect form, params.yaml and MLflow.

Every section is a strict pydantic model: unknown keys and wrong types are refused with a message
that names the field. `model/` receives these objects and never reads files itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

DATASET_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"

SourceName = Literal["digits", "cifar10", "cifar100", "imagefolder"]


class StrictModel(BaseModel):
    """Refuses unknown keys and re-validates on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class FetchConfig(StrictModel):
    """Where a dataset comes from (the DVC `fetch` stage)."""

    source: SourceName = Field("digits", description="Dataset source.")
    url: str | None = Field(
        None,
        description="Mirror URL, file:// URL or local path of the archive; for imagefolder, "
        "the directory or zip laid out <root>/<split>/<class>/<image>.",
    )
    md5: str | None = Field(
        None, pattern=r"^[0-9a-fA-F]{32}$", description="Expected md5 of the archive."
    )
    name: str | None = Field(
        None,
        pattern=DATASET_NAME_PATTERN,
        description="Name the dataset is stored under; default: the source name, or for "
        "imagefolder the zip's or folder's stem.",
    )
    classes: list[str] | None = Field(
        None, description="imagefolder class order; default: sorted folder names."
    )


class PreprocessConfig(StrictModel):
    """How raw data becomes TFRecords (the DVC `preprocess` stage)."""

    shards: int = Field(4, ge=1, le=1024, description="TFRecord files per split.")


class TrainConfig(StrictModel):
    """One training run: model, towers, gradient aggregation, learning-rate policy, data."""

    dataset: str = Field(
        "digits", pattern=DATASET_NAME_PATTERN, description="Preprocessed dataset name."
    )
    model: Literal["tutorial", "resnet20"] = Field("tutorial", description="Network.")
    towers: int = Field(1, ge=1, le=1024, description="Replicas, one per device.")
    device_type: Literal["auto", "gpu", "cpu"] = Field(
        "auto", description="Tower devices: GPUs if present (auto), or force GPU / CPU."
    )
    parameter_device: Literal["cpu", "gpu0"] = Field(
        "cpu", description="Where variables live: the CPU (as in the tutorial) or the first GPU."
    )
    aggregation: Literal["mean", "sum"] = Field(
        "mean",
        description="Combine tower gradients by their mean (Horovod, the tutorial) or sum "
        "(tf.distribute without global-batch loss scaling).",
    )
    global_batch: int = Field(128, ge=1, description="Examples per step over all towers.")
    epochs: float = Field(10, gt=0, description="Passes over the training set.")
    optimizer: Literal["sgd", "momentum"] = Field("sgd", description="Optimizer.")
    momentum: float = Field(0.9, ge=0, lt=1, description="Momentum for optimizer=momentum.")
    base_lr: float = Field(0.1, gt=0, description="Learning rate at the reference batch size.")
    reference_batch: int = Field(128, ge=1, description="Batch size base_lr was tuned for.")
    lr_scaling: Literal["none", "linear", "sqrt"] = Field(
        "none", description="Scale base_lr by (global_batch / reference_batch)^{0, 1, 1/2}."
    )
    warmup_epochs: float = Field(
        0, ge=0, description="Gradual linear warmup from base_lr to the scaled LR (Goyal 2017)."
    )
    decay: Literal["constant", "staircase", "piecewise", "cosine"] = Field(
        "staircase", description="LR decay, counted in epochs."
    )
    decay_epochs: float = Field(
        350, gt=0, description="staircase: multiply the LR by decay_factor every this many epochs."
    )
    decay_factor: float = Field(0.1, gt=0, le=1, description="Factor per staircase/piecewise step.")
    decay_boundaries: list[float] = Field(
        default_factory=list, description="piecewise: epochs at which the LR is multiplied."
    )
    weight_decay: float = Field(
        0.004, ge=0, description="L2 coefficient on tf.nn.l2_loss (sum(w**2)/2), once per step."
    )
    ema_decay: float = Field(
        0.9999, ge=0, lt=1, description="Exponential moving average of the weights."
    )
    crop_size: int | None = Field(
        24, ge=1, description="Random crop (train) / central crop (eval) side; none = full image."
    )
    random_flip: bool = Field(True, description="Random left-right flip.")
    brightness_delta: float = Field(63, ge=0, description="Random brightness, 0-255 scale.")
    contrast_lower: float = Field(0.2, ge=0, description="Random contrast lower factor.")
    contrast_upper: float = Field(1.8, ge=0, description="Random contrast upper factor.")
    seed: int = Field(0, ge=0, description="Seed for weights, data order and distortions.")
    xla: bool = Field(False, description="Compile the training step with XLA.")
    checkpoint_every: int = Field(
        0, ge=0, description="Save a checkpoint every N steps (0: only at the end)."
    )
    eval_every_epochs: float = Field(1, gt=0, description="Evaluate on the test split this often.")
    divergence_loss: float = Field(
        1e3, gt=0, description="Stop early when the loss is NaN or above this."
    )


class DataConfig(StrictModel):
    """Where data lives on disk."""

    data_dir: Path = Field(Path("data"), description="Root of raw archives and TFRecords.")
