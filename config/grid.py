"""Expand a sweep into the distinct training runs it asks for, and name each run."""

from __future__ import annotations

import itertools
import math
from typing import Any

from pydantic import ValidationError

from towerbench.config.model_ref import model_label
from towerbench.config.params import SweepGrid
from towerbench.config.sections import TrainConfig
from towerbench.core.errors import TowerbenchError, describe_validation_error


def canonical(config: TrainConfig) -> TrainConfig:
    """The same run with settings that cannot matter set to one value, so duplicates collapse.

    - one tower (over all workers): the sum of one gradient is its mean;
    - global batch = reference batch: every scaling rule gives factor 1;
    - no scaling: warmup goes from base_lr to base_lr, i.e. it does nothing; nor does it under
      adascale, whose schedule is the reference batch's.
    """
    updates: dict[str, Any] = {}
    if config.replicas == 1:
        updates["aggregation"] = "mean"
    if config.global_batch == config.reference_batch:
        updates["lr_scaling"] = "none"
    if updates.get("lr_scaling", config.lr_scaling) in ("none", "adascale"):
        updates["warmup_epochs"] = 0.0
    return config.model_copy(update=updates)


def epochs_needed(noise_scale: float, reference_batch: float, global_batch: float) -> float:
    """How many times the reference batch's epochs batch B needs for the same progress at this
    noise scale: (1 + B / B_noise) / (1 + b0 / B_noise) (McCandlish et al. 2018; the noise
    scale that advises is explained in model/noise_advice.py)."""
    return (1 + global_batch / noise_scale) / (1 + reference_batch / noise_scale)


def noise_budget(noise_scale: float, reference_batch: float, global_batch: float) -> float:
    """The epochs factor of `sweep.budget: noise`: `epochs_needed`, never less than equal epochs
    (1) nor more than equal updates (B / b0). The formula lies between the two for any positive
    noise scale; the clamp only keeps rounding (and a batch below b0) on the right side."""
    if not (math.isfinite(noise_scale) and noise_scale > 0):
        raise ValueError(f"the noise scale must be positive and finite, got {noise_scale}")
    updates = global_batch / reference_batch
    low, high = min(1.0, updates), max(1.0, updates)
    return min(max(epochs_needed(noise_scale, reference_batch, global_batch), low), high)


def budget_factor(
    global_batch: int,
    reference_batch: int,
    lr_scaling: str,
    budget: str,
    noise_scale: float | None = None,
) -> float:
    """How many times the reference's epochs a run at `global_batch` trains under `budget`:
    1 (equal epochs), B / b0 (equal updates), or the noise scale's factor between the two
    (`noise_budget`). adascale runs are never stretched: they end when their
    progress tau reaches the reference batch's updates, their schedule counted in reference
    epochs."""
    if budget == "epochs" or lr_scaling == "adascale":
        return 1.0
    if budget == "updates":
        return global_batch / reference_batch
    if noise_scale is None:
        raise TowerbenchError("sweep.budget: noise needs sweep.noise_scale")
    return noise_budget(noise_scale, reference_batch, global_batch)


def with_budget(
    values: dict[str, Any], budget: str, noise_scale: float | None = None
) -> dict[str, Any]:
    """Training values under the sweep's budget: every epoch-counted setting (epochs, warmup,
    decay) stretched by `budget_factor`, so under `updates` the run makes the reference batch's
    number of optimizer steps and its LR schedule is the same function of the step (Hoffer et
    al.), and under `noise` the same function of the progress the noise scale predicts."""
    factor = budget_factor(
        values["global_batch"], values["reference_batch"], values["lr_scaling"], budget, noise_scale
    )
    if factor == 1.0:
        return values
    stretched = {
        name: values[name] * factor for name in ("epochs", "warmup_epochs", "decay_epochs")
    }
    stretched["decay_boundaries"] = [epoch * factor for epoch in values["decay_boundaries"]]
    return {**values, **stretched}


def budget_params(config: TrainConfig, budget: str, noise_scale: float | None) -> dict[str, str]:
    """What a configuration's run records of its budget (MLflow params): the sweep's budget, the
    factor its epochs were stretched by and, under `noise`, the noise scale it came from."""
    factor = budget_factor(
        config.global_batch, config.reference_batch, config.lr_scaling, budget, noise_scale
    )
    params = {"budget": budget, "budget_factor": f"{factor:.6g}"}
    if budget == "noise" and noise_scale is not None:
        params["budget_noise_scale"] = f"{noise_scale:.6g}"
    return params


def swept_fields(sweep: SweepGrid) -> list[str]:
    """Training fields besides the named axes that this sweep varies."""
    return [name for name, values in sweep.grid if values is not None]


def _axes(sweep: SweepGrid) -> dict[str, list[Any]]:
    """Each named axis (a training field) and the sweep's list of its values."""
    return {
        "towers": sweep.towers,
        "workers": sweep.workers,
        "aggregation": sweep.aggregation,
        "lr_scaling": sweep.lr_scaling,
        "warmup_epochs": sweep.warmup_epochs,
        "seed": sweep.seeds,
    }


def varied_fields(sweep: SweepGrid) -> list[str]:
    """The training fields the sweep varies: its axes given more than one value, then the
    grid's fields (named in run names)."""
    return [name for name, values in _axes(sweep).items() if len(values) > 1] + swept_fields(sweep)


def sweep_description(train: TrainConfig, sweep: SweepGrid) -> dict[str, Any]:
    """The sweep as its parent run's params: the sweep's lists and budget, and the training
    values every run shares (not those the sweep sets per run, nor unset ones)."""
    per_run = {*_axes(sweep), *swept_fields(sweep)}
    if sweep.per_tower_batch is not None:
        per_run.add("global_batch")
    shared = {
        name: value
        for name, value in train.model_dump(mode="json").items()
        if name not in per_run and value is not None
    }
    lists = sweep.model_dump(mode="json", exclude={"grid"}, exclude_none=True)
    grid = sweep.grid.model_dump(mode="json", exclude_none=True)
    # The sweep first: MLflow lists a run's params in the order they were logged.
    return {"sweep": lists | ({"grid": grid} if grid else {}), "train": shared}


def expand(train: TrainConfig, sweep: SweepGrid) -> list[TrainConfig]:
    """One TrainConfig per distinct run: `train` with each combination of the sweep's lists, in
    a stable order."""
    axes = _axes(sweep)
    axes.update({name: getattr(sweep.grid, name) for name in swept_fields(sweep)})
    if sweep.per_tower_batch is not None and "global_batch" in axes:
        raise TowerbenchError("sweep: give either per_tower_batch or grid.global_batch, not both")
    # The values given, not those presets filled in: each run's model, dataset and optimizer
    # bring their own presets (an adaptive optimizer its own LR).
    base = train.model_dump(exclude_unset=True)
    runs: list[TrainConfig] = []
    seen: set[str] = set()
    for combination in itertools.product(*axes.values()):
        values = dict(zip(axes, combination, strict=True))
        if sweep.per_tower_batch is not None:
            values["global_batch"] = values["towers"] * values["workers"] * sweep.per_tower_batch
        try:
            resolved = TrainConfig.model_validate({**base, **values})
            budgeted = with_budget(resolved.model_dump(), sweep.budget, sweep.noise_scale)
            config = canonical(TrainConfig.model_validate(budgeted))
        except ValidationError as error:
            problems = describe_validation_error(error)
            raise TowerbenchError(f"sweep: run {values} is invalid: {problems}") from None
        key = config.model_dump_json()
        if key not in seen:
            seen.add(key)
            runs.append(config)
    return runs


def _format(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _format_field(config: TrainConfig, name: str) -> str:
    """A swept field's value as labels show it; a model file by its function's name."""
    return model_label(config.model) if name == "model" else _format(getattr(config, name))


def group_name(config: TrainConfig, extra_fields: list[str] | tuple[str, ...] = ()) -> str:
    """`towers=4 agg=mean lr=linear warmup=2` (`workers=2 towers=2 ...` with several workers, +
    any other swept field): one configuration."""
    parts = [f"workers={config.workers}"] if config.workers > 1 else []
    parts += [
        f"towers={config.towers}",
        f"agg={config.aggregation}",
        f"lr={config.lr_scaling}",
        f"warmup={_format(config.warmup_epochs)}",
    ]
    if config.precision != "float32":
        parts.append(f"precision={config.precision}")
    parts += [f"{name}={_format_field(config, name)}" for name in extra_fields]
    return " ".join(parts)


def run_name(config: TrainConfig, extra_fields: list[str] | tuple[str, ...] = ()) -> str:
    """`towers=4 agg=mean lr=linear warmup=2 seed=1`: one configuration with one seed."""
    return f"{group_name(config, extra_fields)} seed={config.seed}"
