"""What `towerbench advise` keeps: the recipe as a params file to reuse (`advise-<id>.yaml`),
and an MLflow run (kind `advise`) with the probe's numbers, the recipe and the verdict."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import yaml
from mlflow.entities import Metric, RunTag
from pydantic import BaseModel

from towerbench.config.params import Params, SweepGrid
from towerbench.config.sections import TrainConfig
from towerbench.core.files import write_atomically
from towerbench.model.probe import ProbeResult
from towerbench.tasks.advise.recipe import Measurements, Recipe
from towerbench.tasks.advise.verdict import Verification
from towerbench.tasks.tracking import (
    KIND_TAG,
    client_for,
    ensure_experiment,
    experiment_name,
    flat_params,
    log_params,
)

SWEEP_TAG = "towerbench.advise.sweep"  # the verification sweep's parent run
VERDICT_TAG = "towerbench.advise.verdict"


class Advice(BaseModel):
    """What `towerbench advise` found, as its `--json` document and the flow's result."""

    advise_run_id: str
    params_file: str
    probe: dict[str, Any]
    measurements: dict[str, Any]
    recipe: dict[str, dict[str, Any]]  # choice -> {value, reason}
    lines: list[str]  # what the command prints
    verification: Verification | None = None


def probe_document(result: ProbeResult) -> dict[str, Any]:
    return {
        **dataclasses.asdict(result),
        "largest_stable_lr": result.largest_stable_lr,
        "instability": result.instability,
    }


def recipe_document(recipe: Recipe) -> dict[str, dict[str, Any]]:
    """Each choice as {value, reason}; the optimizer's with its hyperparameters as the K-tower
    run uses them."""
    choices = {
        "optimizer": recipe.optimizer,
        "lr_scaling": recipe.lr_scaling,
        "warmup_epochs": recipe.warmup_epochs,
        "budget": recipe.budget,
        "decay": recipe.decay,
    }
    document = {name: dataclasses.asdict(choice) for name, choice in choices.items()}
    document["optimizer"]["hyperparameters"] = recipe.hyperparameters
    return document


def recipe_params(params: Params, train: TrainConfig, grid: SweepGrid) -> dict[str, Any]:
    """`params` with the recipe's `train:` (the 1-tower run and the recipe's LR policy) and its
    verification `sweep:`; `towerbench sweep --params` on it runs the verification again."""
    recipe = params.model_copy(update={"train": train, "sweep": grid})
    sections = recipe.model_dump(mode="json", exclude_defaults=True, exclude={"nightly"})
    sections["train"] = train.model_dump(mode="json", exclude_defaults=True)
    sections["sweep"] = grid.model_dump(mode="json", exclude={"grid", "preset"}, exclude_none=True)
    return sections


def write_params_file(
    folder: Path, run_id: str, sections: dict[str, Any], lines: list[str]
) -> Path:
    """DIR/advise-<id>.yaml, whole or not at all, the recipe's reasons as its header."""
    path = Path(folder) / f"advise-{run_id[:8]}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    header = [f"# towerbench advise (MLflow run {run_id}): the recipe, each choice and why."]
    header += [f"#   {line}" for line in lines]
    header.append("# `towerbench sweep --params THIS_FILE` runs its verification again.")
    text = "\n".join(header) + "\n" + yaml.safe_dump(sections, sort_keys=False)
    write_atomically(path, text.encode())
    return path


def start_advice_run(params: Params, towers: int) -> str:
    """The advise run in the experiment the verification sweep logs to; its id."""
    tracking = params.tracking
    experiment_id = ensure_experiment(tracking, experiment_name(tracking, params.train))
    name = f"advise {params.train.dataset} {towers} towers {time.strftime('%Y-%m-%d %H:%M:%S')}"
    run = client_for(tracking).create_run(experiment_id, run_name=name, tags={KIND_TAG: "advise"})
    return run.info.run_id


def log_advice(
    params: Params,
    run_id: str,
    measured: Measurements,
    recipe: Recipe,
    params_file: Path,
    lines: list[str],
) -> None:
    """The measurements as params and metrics, the recipe as text and as its params file."""
    client = client_for(params.tracking)
    values = dataclasses.asdict(measured)
    log_params(client, run_id, flat_params({"measured": values, **recipe.sections()}))
    numbers = {
        "noise_scale": measured.usable_noise_scale,
        "largest_stable_lr": measured.largest_stable_lr,
        "predicted_gain": recipe.predicted_gain,
    }
    now = int(time.time() * 1000)
    metrics = [Metric(key, value, now, 0) for key, value in numbers.items() if value is not None]
    client.log_batch(run_id, metrics=metrics)
    client.log_text(run_id, "\n".join(lines) + "\n", "recipe.txt")
    client.log_artifact(run_id, str(params_file))


def finish_advice_run(
    params: Params, run_id: str, verification: Verification | None, status: str
) -> None:
    """The verdict (if verified) as tags and metrics, then the run closed with `status`
    (FINISHED, FAILED or KILLED)."""
    client = client_for(params.tracking)
    if verification is not None:
        tags = [RunTag(SWEEP_TAG, verification.parent_run_id)]
        tags.append(RunTag(VERDICT_TAG, verification.verdict[:5000]))
        now = int(time.time() * 1000)
        numbers = {
            "difference_pp": verification.difference_pp,
            "ci_low_pp": verification.ci_low_pp,
            "ci_high_pp": verification.ci_high_pp,
            "time_ratio": verification.time_ratio,
            "reached": float(verification.reached),
        }
        tags.append(RunTag("towerbench.advise_outcome", verification.outcome))
        metrics = [Metric(k, v, now, 0) for k, v in numbers.items() if v is not None]
        client.log_batch(run_id, metrics=metrics, tags=tags)
    client.set_terminated(run_id, status)
