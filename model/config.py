"""Typed configuration: one source of truth for the CLI, Prefect form, params.yaml and MLflow.

Every section is a strict pydantic model: unknown keys and wrong types are refused with a message
that names the field. `model/` receives these objects and never reads files itself.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal
from zoneinfo import available_timezones

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    create_model,
    field_validator,
    model_validator,
)

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
        "the directory or zip laid out ROOT/SPLIT/CLASS/IMAGE.",
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
    retries: int = Field(
        3,
        ge=0,
        le=20,
        description="Download retries after a dropped connection or server error "
        "(exponential backoff; each retry resumes with an HTTP Range request).",
    )


class PreprocessConfig(StrictModel):
    """How raw data becomes TFRecords (the DVC `preprocess` stage)."""

    shards: int = Field(4, ge=1, le=1024, description="TFRecord files per split.")
    image_size: int | None = Field(
        None,
        ge=1,
        le=4096,
        description="imagefolder: resize every image to this square side; default: the most "
        "common height x width in the folder.",
    )
    label_set: Literal["fine", "coarse"] = Field(
        "fine", description="cifar100: label the 100 fine classes or the 20 coarse superclasses."
    )


# Settings that suit a model or a dataset better than the tutorial's defaults. They replace a
# default only: a value the user gives explicitly always wins (dataset presets over model presets).
MODEL_PRESETS: dict[str, dict[str, object]] = {
    # He et al. 2016: momentum 0.9, weight decay 1e-4 (= 1e-4 * l2_loss), full 32x32 images
    # with flips; the tutorial's brightness/contrast distortions are not part of it.
    "resnet20": {
        "optimizer": "momentum",
        "weight_decay": 1e-4,
        "crop_size": None,
        "brightness_delta": 0.0,
        "contrast_lower": 1.0,
        "contrast_upper": 1.0,
    },
}
DATASET_PRESETS: dict[str, dict[str, object]] = {
    # 8x8 grey digits: no crop, no flips (a mirrored 2 is not a 2), no brightness/contrast jitter;
    # momentum reaches ~98% test accuracy in 15 epochs (plain SGD at 0.1 needs about 30).
    "digits": {
        "crop_size": None,
        "random_flip": False,
        "brightness_delta": 0.0,
        "contrast_lower": 1.0,
        "contrast_upper": 1.0,
        "optimizer": "momentum",
        "base_lr": 0.05,
        "epochs": 15,
    },
}


class TrainConfig(StrictModel):
    """One training run: model, towers, gradient aggregation, learning-rate policy, data.

    Presets (MODEL_PRESETS, DATASET_PRESETS) fill the fields the user did not give.
    """

    dataset: str = Field(
        "digits", pattern=DATASET_NAME_PATTERN, description="Preprocessed dataset name."
    )
    model: Literal["tutorial", "tutorial_bn", "resnet20"] = Field(
        "tutorial",
        description="Network: the tutorial's CNN (LRN), the same with BatchNorm in place of each "
        "LRN (statistics per tower), or ResNet-20.",
    )
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
    optimizer: Literal["sgd", "momentum", "nesterov"] = Field(
        "sgd", description="Plain SGD, heavy-ball momentum or Nesterov momentum."
    )
    momentum: float = Field(0.9, ge=0, lt=1, description="Momentum for momentum/nesterov.")
    base_lr: float = Field(0.1, gt=0, description="Learning rate at the reference batch size.")
    reference_batch: int = Field(128, ge=1, description="Batch size base_lr was tuned for.")
    lr_scaling: Literal["none", "linear", "sqrt"] = Field(
        "none", description="Scale base_lr by (global_batch / reference_batch)^{0, 1, 1/2}."
    )
    warmup_epochs: float = Field(
        0, ge=0, description="Gradual linear warmup from base_lr to the scaled LR (Goyal 2017)."
    )
    decay: Literal["constant", "staircase", "piecewise", "cosine", "linear"] = Field(
        "staircase",
        description="LR decay, counted in epochs; cosine and linear reach 0 at the run's last "
        "epoch (linear after warmup: the one-cycle shape).",
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
        0,
        ge=0,
        description="With a checkpoint folder: also save every N steps (0: at each epoch's "
        "end only).",
    )
    eval_every_epochs: float = Field(1, gt=0, description="Evaluate on the test split this often.")
    divergence_factor: float = Field(
        3.0,
        gt=1,
        description="Stop early when a step's cross-entropy is NaN or above this many times "
        "chance level (ln of the number of classes).",
    )

    @field_validator("global_batch")
    @classmethod
    def _batch_divides_over_towers(cls, global_batch: int, info: ValidationInfo) -> int:
        towers = info.data.get("towers")
        if towers is not None and global_batch % towers:
            raise ValueError(
                f"{global_batch} is not divisible by --towers {towers}; each tower needs the "
                f"same share (try {max(global_batch // towers, 1) * towers})"
            )
        return global_batch

    @model_validator(mode="after")
    def _apply_presets_and_check(self) -> TrainConfig:
        for name, value in self.preset_fields().items():
            self.__dict__[name] = value  # a constant of ours: no re-validation needed
        if self.contrast_upper < self.contrast_lower:
            raise ValueError(
                f"--contrast-upper {self.contrast_upper} is below --contrast-lower "
                f"{self.contrast_lower}"
            )
        if self.decay == "piecewise" and not self.decay_boundaries:
            raise ValueError("--decay piecewise needs --decay-boundaries (epochs, comma-separated)")
        return self

    @classmethod
    def from_stored(cls, text: str) -> TrainConfig:
        """A configuration saved as JSON by this or an earlier version (keys since removed are
        dropped, keys since added take their defaults)."""
        values = json.loads(text)
        return cls.model_validate({key: values[key] for key in cls.model_fields if key in values})

    def preset_fields(self) -> dict[str, object]:
        """Fields whose value came from a preset (not the user, not the plain default)."""
        preset = {**MODEL_PRESETS.get(self.model, {}), **DATASET_PRESETS.get(self.dataset, {})}
        return {name: value for name, value in preset.items() if name not in self.model_fields_set}


class DataConfig(StrictModel):
    """Where data lives on disk."""

    data_dir: Path = Field(Path("data"), description="Root of raw archives and TFRecords.")


# --- Orchestration: sweeps, tracking, the scheduled benchmark, the pipeline (issue 4) ---

# Fields the sweep varies through its own named lists; the rest of TrainConfig goes through `grid`.
SWEEP_AXES = ("towers", "aggregation", "lr_scaling", "warmup_epochs", "seed")


def _grid_field(name: str) -> tuple[object, object]:
    field = TrainConfig.model_fields[name]
    return (
        list[field.annotation] | None,  # type: ignore[name-defined]
        Field(
            None, min_length=1, description=f"Values of train.{name} to sweep. {field.description}"
        ),
    )


TrainGrid = create_model(
    "TrainGrid",
    __base__=StrictModel,
    __doc__="Any other training parameter given as a list of values to sweep over.",
    **{name: _grid_field(name) for name in TrainConfig.model_fields if name not in SWEEP_AXES},
)


# Whole experiments, reproducible with one `sweep.preset:` line (the README's CIFAR-10 findings).
SWEEP_PRESETS: dict[str, dict[str, dict[str, object]]] = {
    # The question's tutorial network at equal updates: 1 tower for 5 epochs vs 4 towers for 20.
    "cure-updates": {
        "train": {
            "model": "tutorial",
            "optimizer": "sgd",
            "base_lr": 0.1,
            "reference_batch": 128,
            "decay": "constant",
            "epochs": 5,
        },
        "sweep": {
            "towers": [1, 4],
            "aggregation": ["mean"],
            "lr_scaling": ["sqrt", "linear"],
            "warmup_epochs": [1],
            "per_tower_batch": 128,
            "budget": "updates",
        },
    },
    # BatchNorm in place of LRN, Nesterov, warmup then linear decay to 0, at equal epochs.
    "cure-bn": {
        "train": {
            "model": "tutorial_bn",
            "optimizer": "nesterov",
            "momentum": 0.9,
            "base_lr": 0.05,
            "reference_batch": 128,
            "decay": "linear",
            "epochs": 12,
        },
        "sweep": {
            "towers": [1, 4],
            "aggregation": ["mean"],
            "lr_scaling": ["linear"],
            "warmup_epochs": [2],
            "per_tower_batch": 128,
            "budget": "epochs",
        },
    },
}
SweepPresetName = Literal[tuple(SWEEP_PRESETS)]  # type: ignore[valid-type]


def apply_sweep_preset(sections: dict[str, dict]) -> dict[str, dict]:
    """`train`/`sweep` sections with the named `sweep.preset`'s values written over them."""
    name = (sections.get("sweep") or {}).get("preset")
    if name not in SWEEP_PRESETS:
        return sections  # no preset, or an unknown name that validation will refuse by name
    preset = SWEEP_PRESETS[name]
    return {
        **sections,
        "train": {**(sections.get("train") or {}), **preset["train"]},
        "sweep": {**(sections.get("sweep") or {}), **preset["sweep"]},
    }


class SweepGrid(StrictModel):
    """The lists a sweep takes the product of (one run per combination)."""

    towers: list[int] = Field([1, 2, 4], min_length=1, description="Tower counts to compare.")
    aggregation: list[Literal["mean", "sum"]] = Field(
        ["mean"], min_length=1, description="Gradient aggregations to compare."
    )
    lr_scaling: list[Literal["none", "linear", "sqrt"]] = Field(
        ["linear"], min_length=1, description="Learning-rate scaling rules to compare."
    )
    warmup_epochs: list[float] = Field(
        [0], min_length=1, description="Warmup lengths (epochs) to compare."
    )
    seeds: list[int] = Field(
        [0, 1], min_length=1, description="Seeds: each configuration runs once per seed."
    )
    budget: Literal["epochs", "updates"] = Field(
        "epochs",
        description="Compare at equal epochs, or at equal updates: each run trains "
        "epochs x global_batch / reference_batch epochs, with every epoch-counted schedule "
        "setting (warmup, decay) stretched by the same factor, so it makes the reference "
        "batch's number of optimizer steps (Hoffer et al. 2017).",
    )
    preset: SweepPresetName | None = Field(
        None,
        description="A measured experiment (see SWEEP_PRESETS): its train and sweep settings win "
        "over params.yaml's; command-line options win over it.",
    )
    per_tower_batch: int | None = Field(
        None,
        ge=1,
        description="If set, global_batch = towers x this (the batch per device stays fixed, as "
        "when adding GPUs); if unset, every run uses train.global_batch.",
    )
    grid: TrainGrid = Field(  # type: ignore[valid-type]
        default_factory=TrainGrid, description="Other training parameters to sweep, as lists."
    )


class SweepConfig(SweepGrid):
    """A controlled sweep: the shared training settings and the lists to vary."""

    base: TrainConfig = Field(
        default_factory=TrainConfig, description="Training settings shared by every run."
    )


class TrackingConfig(StrictModel):
    """Where runs are recorded (MLflow)."""

    tracking_uri: str | None = Field(
        None,
        description="MLflow tracking URI; default: MLFLOW_TRACKING_URI or the SQLite file "
        "mlflow.db in the project. A relative sqlite path is made absolute.",
    )
    artifact_root: str | None = Field(
        None,
        description="Where new experiments store artifacts; default: mlartifacts/ next to the "
        "SQLite file (server URIs: the server's default).",
    )
    experiment: str | None = Field(
        None, min_length=1, description="Experiment name; default: towerbench-DATASET-MODEL."
    )
    ui_url: str = Field(
        "http://127.0.0.1:5000", description="MLflow UI address used in report links."
    )


class ReportConfig(StrictModel):
    """How sweeps are compared."""

    target_accuracy: float | None = Field(
        None,
        gt=0,
        le=1,
        description="Test accuracy for time-to-accuracy; default: 0.95 x the 1-tower mean.",
    )
    report_dir: Path = Field(Path("reports"), description="Folder the markdown reports go to.")


class PipelineConfig(StrictModel):
    """fetch -> preprocess (DVC) -> sweep -> report."""

    project_dir: Path = Field(
        Path("."),
        description="DVC project (dvc.yaml + params.yaml) the data is built in; fetch and "
        "preprocess must match its params.yaml.",
    )
    fetch: FetchConfig = Field(default_factory=FetchConfig, description="Dataset source.")
    preprocess: PreprocessConfig = Field(
        default_factory=PreprocessConfig, description="TFRecord preprocessing."
    )
    data: DataConfig = Field(default_factory=DataConfig, description="Data location.")
    sweep: SweepConfig = Field(default_factory=SweepConfig, description="Runs to compare.")
    tracking: TrackingConfig = Field(default_factory=TrackingConfig, description="MLflow.")
    report: ReportConfig = Field(default_factory=ReportConfig, description="Comparison report.")


class BenchmarkConfig(StrictModel):
    """A fixed small sweep on a schedule, compared with its previous run."""

    cron: str = Field(
        "0 3 * * *",
        pattern=r"^\S+( \S+){4}$",
        description="Schedule (cron, 5 fields, in `timezone`); default nightly at 03:00.",
    )
    timezone: str = Field(
        "UTC", description="IANA time zone the cron schedule is read in, e.g. Europe/Berlin."
    )
    sweep: SweepConfig = Field(
        default_factory=lambda: SweepConfig(towers=[1, 2], seeds=[0, 1]),
        description="The fixed sweep; keep it unchanged so results stay comparable.",
    )

    @field_validator("timezone")
    @classmethod
    def _known_time_zone(cls, timezone: str) -> str:
        # The tz database's names, less the system's "localtime" link, which Prefect refuses.
        if timezone == "localtime" or timezone not in available_timezones():
            raise ValueError(f"{timezone!r} is not an IANA time zone (e.g. UTC, Europe/Berlin)")
        return timezone


class Params(StrictModel):
    """params.yaml: one section per stage."""

    fetch: FetchConfig = Field(default_factory=FetchConfig)
    preprocess: PreprocessConfig = Field(default_factory=PreprocessConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    sweep: SweepGrid = Field(default_factory=SweepGrid)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    report: ReportConfig = Field(default_factory=ReportConfig)
    benchmark: BenchmarkConfig = Field(default_factory=BenchmarkConfig)

    def pipeline(self, project_dir: Path) -> PipelineConfig:
        """The pipeline these parameters describe (sweep over the `train` settings), building
        its data in the DVC project `project_dir` (the folder of this params.yaml)."""
        sweep = SweepConfig(base=self.train, **self.sweep.model_dump(exclude_unset=True))
        return PipelineConfig(
            project_dir=project_dir,
            fetch=self.fetch,
            preprocess=self.preprocess,
            data=self.data,
            sweep=sweep,
            tracking=self.tracking,
            report=self.report,
        )

    def benchmark_pipeline(self, project_dir: Path) -> PipelineConfig:
        """The scheduled benchmark: the same data and tracking, the benchmark's fixed sweep."""
        return self.pipeline(project_dir).model_copy(update={"sweep": self.benchmark.sweep})
