"""The Prefect Run form of the pipeline deployment: the few settings a person changes per run.

Each field is the `Params` field it sets (same type, same description), so the form, the CLI and
params.yaml cannot disagree; everything else comes from the params file, or from `advanced`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, create_model

from towerbench.config.load import Override, override_at
from towerbench.config.losses import absolute_loss
from towerbench.config.model_ref import absolute_model
from towerbench.config.params import Params, SweepGrid
from towerbench.config.sections import FetchConfig, StrictModel, TrainConfig, dataset_name
from towerbench.core.errors import TowerbenchError

DATASET_FIELDS = ("source", "url", "name")
SWEEP_FIELDS = (
    "towers",
    "seeds",
    "lr_scaling",
    "warmup_epochs",
    "aggregation",
    "budget",
    "pool",
)


def _pick(
    name: str, model: type[BaseModel], fields: tuple[str, ...], doc: str
) -> type[StrictModel]:
    """A form section made of some of `model`'s fields, with their types and descriptions."""
    definitions: dict[str, Any] = {
        field: (model.model_fields[field].annotation, model.model_fields[field]) for field in fields
    }
    return create_model(name, __base__=StrictModel, __doc__=doc, **definitions)


DatasetChoice = _pick(
    "DatasetChoice",
    FetchConfig,
    DATASET_FIELDS,
    "The dataset to fetch, preprocess (through DVC) and train on.",
)
SweepChoice = _pick(
    "SweepChoice", SweepGrid, SWEEP_FIELDS, "The lists the sweep compares, and where it runs."
)


def model_override(model: str | None, params_path: Path | None) -> list[Override]:
    """The form's `model` text (empty: the params file's) as an override; a model file is taken
    relative to the params file's folder, as params.yaml's are (a served flow runs elsewhere).
    One line naming `model` when it is not a model reference or the file is missing."""
    return _function_override("model", absolute_model, model, params_path)


def loss_override(loss: str | None, params_path: Path | None) -> list[Override]:
    """The form's `loss` text (empty: the params file's) as an override, a loss file taken as
    a model file is."""
    return _function_override("loss", absolute_loss, loss, params_path)


def _function_override(
    field: str, absolute: Callable[[str, Path], str], text: str | None, params_path: Path | None
) -> list[Override]:
    if text is None or not text.strip():
        return []
    base = params_path.resolve().parent if params_path is not None else Path.cwd()
    try:
        return [Override(TrainConfig, field, absolute(text.strip(), base), field)]
    except ValueError as error:
        raise TowerbenchError(f"{field}: {error}") from None


def optimizer_override(optimizer: str | None) -> list[Override]:
    """The form's optimizer (empty: the params file's) as an override."""
    return [] if optimizer is None else [Override(TrainConfig, "optimizer", optimizer, "optimizer")]


def form_parameters(params: Params, params_path: Path) -> dict[str, Any]:
    """The form's values for `params` (the deployment's defaults), as JSON."""
    dataset = params.fetch.model_dump(mode="json", include=set(DATASET_FIELDS))
    if params.fetch.name == dataset_name(params.fetch.model_copy(update={"name": None})):
        # Left empty, the name follows the source: changing only the source cannot collide
        # with params.yaml's dataset of the same name.
        dataset["name"] = None
    return {
        "dataset": dataset,
        "sweep": params.sweep.model_dump(mode="json", include=set(SWEEP_FIELDS)),
        "epochs": params.train.epochs,
        "optimizer": params.train.optimizer,  # a choice of the eight, the file's shown
        "advanced": {},
        "params_file": str(params_path.resolve()),
    }


def _identity(fetch: FetchConfig) -> dict[str, Any]:
    """The dataset fields, with the name the data is stored under."""
    return {**fetch.model_dump(include=set(DATASET_FIELDS)), "name": dataset_name(fetch)}


def form_overrides(
    dataset: BaseModel,
    sweep: BaseModel,
    epochs: float,
    advanced: dict[str, Any],
    file_fetch: FetchConfig,
) -> list[Override]:
    """The form's values as overrides of the params file: the dataset is also the training
    dataset, and a dataset other than the file's drops the file's md5 and class list."""
    overrides = [Override(FetchConfig, f, v, f"dataset.{f}") for f, v in dataset]
    overrides += [Override(SweepGrid, f, v, f"sweep.{f}") for f, v in sweep]
    chosen = FetchConfig(**dict(dataset))
    if _identity(chosen) != _identity(file_fetch):
        overrides += [Override(FetchConfig, f, None, "dataset") for f in ("md5", "classes")]
    overrides.append(Override(TrainConfig, "dataset", dataset_name(chosen), "dataset"))
    overrides.append(Override(TrainConfig, "epochs", epochs, "epochs"))
    # Last, so they win: any other setting, keyed as in params.yaml (`train.base_lr`).
    overrides += [override_at(key, value, f"advanced.{key}") for key, value in advanced.items()]
    return overrides
