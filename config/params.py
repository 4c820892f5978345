"""The whole params.yaml tree: the sweep's lists, tracking, the report, the nightly sweep.

The sections a single run needs (fetch, preprocess, data, train) are in config/sections.py; this
module puts them together with the orchestration's sections into `Params`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal
from zoneinfo import available_timezones

from pydantic import Field, ValidationError, create_model, field_validator, model_validator

from towerbench.config.sections import (
    DataConfig,
    FetchConfig,
    PreprocessConfig,
    StrictModel,
    TrainConfig,
    one_value,
)
from towerbench.core.errors import describe_validation_error, dotted

# Fields the sweep varies through its own named lists; the rest of TrainConfig goes through `grid`.
SWEEP_AXES = ("towers", "workers", "aggregation", "lr_scaling", "warmup_epochs", "seed")


def _grid_fields() -> dict[str, Any]:
    """Every training parameter but the sweep's axes as a list of values to sweep, as
    `create_model` takes fields: name -> (type, Field)."""
    return {
        name: (
            list[one_value(TrainConfig, name)] | None,  # type: ignore[misc]
            Field(
                None,
                min_length=1,
                description=f"Values of train.{name} to sweep. {field.description}",
            ),
        )
        for name, field in TrainConfig.model_fields.items()
        if name not in SWEEP_AXES
    }


TrainGrid = create_model(
    "TrainGrid",
    __base__=StrictModel,
    __doc__="Any other training parameter given as a list of values to sweep over.",
    **_grid_fields(),
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

    towers: list[one_value(TrainConfig, "towers")] = Field(  # type: ignore[valid-type]
        [1, 2, 4], min_length=1, description="Tower counts to compare."
    )
    workers: list[one_value(TrainConfig, "workers")] = Field(  # type: ignore[valid-type]
        [1],
        min_length=1,
        description="Worker counts to compare (towers are per worker), e.g. 1 worker x 4 "
        "towers against 2 workers x 2 towers at the same global batch.",
    )
    aggregation: list[one_value(TrainConfig, "aggregation")] = Field(  # type: ignore[valid-type]
        ["mean"],
        min_length=1,
        description="Gradient aggregations to compare (a single replica is named agg=mean: "
        "the sum of one gradient is its mean).",
    )
    lr_scaling: list[one_value(TrainConfig, "lr_scaling")] = Field(  # type: ignore[valid-type]
        ["linear"],
        min_length=1,
        description="Learning-rate scaling rules to compare. A run at the reference batch "
        "(global_batch = reference_batch, e.g. 1 tower x per_tower_batch = reference_batch) is "
        "named lr=none warmup=0 whatever is asked: every rule gives base_lr there.",
    )
    warmup_epochs: list[one_value(TrainConfig, "warmup_epochs")] = Field(  # type: ignore[valid-type]
        [0],
        min_length=1,
        description="Warmup lengths (epochs) to compare; 0 where the LR is not scaled (lr=none, "
        "adascale, or the reference batch): a warmup from base_lr to base_lr does nothing.",
    )
    seeds: list[one_value(TrainConfig, "seed")] = Field(  # type: ignore[valid-type]
        [0, 1], min_length=1, description="Seeds: each configuration runs once per seed."
    )
    budget: Literal["epochs", "updates", "noise"] = Field(
        "epochs",
        description="Compare at equal epochs; at equal updates: each run trains "
        "epochs x global_batch / reference_batch epochs, with every epoch-counted schedule "
        "setting (warmup, decay) stretched by the same factor, so it makes the reference "
        "batch's number of optimizer steps (Hoffer et al. 2017); or at the noise scale's "
        "budget: epochs x (1 + B / noise_scale) / (1 + b0 / noise_scale), the epochs batch B "
        "needs for the reference's progress (McCandlish et al. 2018), between the two. "
        "adascale runs keep their own budget (progress tau).",
    )
    noise_scale: float | None = Field(
        None,
        gt=0,
        allow_inf_nan=False,
        description="The advising gradient noise scale B_noise that `budget: noise` uses (the "
        "harmonic mean along `towerbench advise`'s probe, or a run's report); required by it.",
    )
    preset: SweepPresetName | None = Field(  # type: ignore[valid-type]
        None,
        description="A measured experiment (see SWEEP_PRESETS): its train and sweep settings win "
        "over params.yaml's; command-line options win over it.",
    )
    per_tower_batch: int | None = Field(
        None,
        ge=1,
        description="If set, global_batch = workers x towers x this (the batch per device stays "
        "fixed, as when adding GPUs); if unset, every run uses train.global_batch.",
    )
    grid: TrainGrid = Field(
        default_factory=TrainGrid, description="Other training parameters to sweep, as lists."
    )
    pool: str | None = Field(
        None,
        min_length=1,
        description="Prefect work pool to fan the configurations out to, one flow run each "
        "(`towerbench worker --pool NAME` on every GPU host); unset: one local process each.",
    )

    @model_validator(mode="after")
    def _noise_budget_has_its_noise_scale(self) -> SweepGrid:
        if self.budget == "noise" and self.noise_scale is None:
            raise ValueError(
                "budget: noise needs sweep.noise_scale: run `towerbench advise` (its recipe "
                "sets it) or set sweep.noise_scale (in the run form: under advanced)"
            )
        return self


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
        description="The test metric's value for time-to-target, in its own units (accuracy by "
        "default, a fraction: 0.8 = 80%; MAE in the labels' units); default: 95% of the worst "
        "1-tower mean (105% of an error's, MAE/RMSE).",
    )
    report_dir: Path = Field(Path("reports"), description="Folder the markdown reports go to.")
    margin: float | None = Field(
        None,
        gt=0,
        description="Non-inferiority margin in the test metric's own units (0.01 = 1 pp of "
        "accuracy): k towers reached 1 tower when the 95% interval of their difference lies "
        "above -margin (below +margin for an error: MAE, RMSE), did not when it lies beyond, "
        "else the verdict is inconclusive (with the seeds that would decide it). Default: 0.01 "
        "for accuracy, binary accuracy and AUC; 1% of the 1-tower value for MAE and RMSE.",
    )


class NightlyConfig(StrictModel):
    """The nightly accuracy sweep: the file's `train:` and `sweep:` with this patch on top, on a
    schedule, compared with its previous run."""

    cron: str = Field(
        "0 3 * * *",
        pattern=r"^\S+( \S+){4}$",
        description="Schedule (cron, 5 fields, in `timezone`); default nightly at 03:00.",
    )
    timezone: str = Field(
        "UTC", description="IANA time zone the cron schedule is read in, e.g. Europe/Berlin."
    )
    train: dict[str, Any] = Field(
        default_factory=dict,
        description="train: values that differ in the nightly sweep (e.g. fewer epochs).",
    )
    sweep: dict[str, Any] = Field(
        default_factory=lambda: {"towers": [1, 2]},
        description="sweep: values that differ in the nightly sweep; keep the patch and the file "
        "unchanged so its results stay comparable.",
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
    nightly: NightlyConfig = Field(default_factory=NightlyConfig)

    @model_validator(mode="after")
    def _nightly_patch_applies(self) -> Params:
        self.nightly_params()
        return self

    def nightly_params(self) -> Params:
        """These parameters with the nightly's patch on `train:` and `sweep:`."""
        patched = {}
        for section, model in (("train", TrainConfig), ("sweep", SweepGrid)):
            values = getattr(self, section).model_dump(exclude_unset=True)
            try:
                patched[section] = model.model_validate(
                    {**values, **getattr(self.nightly, section)}
                )
            except ValidationError as error:
                raise ValueError(
                    describe_validation_error(error, lambda at: dotted(("nightly", section, *at)))  # noqa: B023
                ) from None
        return self.model_copy(update=patched)
