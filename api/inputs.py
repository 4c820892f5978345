"""The keywords of towerbench's Python functions as the typed configuration the CLI loads.

A keyword names a field of params.yaml by its own name: `epochs`, `optimizer`, `base_lr` (train:),
the sweep's lists `towers`, `seeds`, `budget` (sweep:), and `params`, `tracking_uri`, `data_dir`.
They become the same `Override`s the command line's options are, so the same loader validates
them and refuses a bad one with the same one-line message, naming the keyword (`epochs=`).
"""

from __future__ import annotations

import typing
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from towerbench.api.arrays_data import Arrays, dataset_from_arrays
from towerbench.api.notebook_model import LOSS, MODEL, function_file
from towerbench.config.load import Override, load
from towerbench.config.params import SWEEP_AXES, Params, SweepGrid, TrackingConfig, TrainGrid
from towerbench.config.sections import DataConfig, TrainConfig
from towerbench.core.errors import TowerbenchError

ModelArgument = str | Callable[..., object] | None
DataArgument = str | Arrays | None  # a dataset's name, or the arrays
DEFAULT_DATA_DIR = DataConfig.model_fields["data_dir"].default


def _option(name: str) -> str:
    return f"{name}="


def _is_list_field(model: type[BaseModel], name: str) -> bool:
    return typing.get_origin(model.model_fields[name].annotation) is list


def train_overrides(fields: dict[str, Any], lists_to_grid: bool = False) -> list[Override]:
    """`train:` values by field name; with `lists_to_grid`, a list of values is swept
    (`sweep.grid`) as the sweep command's repeated option is."""
    overrides = []
    for name, value in fields.items():
        if name not in TrainConfig.model_fields:
            raise TowerbenchError(f"{_option(name)}: no such setting in params.yaml's train:")
        swept = lists_to_grid and isinstance(value, list | tuple)
        if swept and not _is_list_field(TrainConfig, name):
            if name in SWEEP_AXES:
                raise TowerbenchError(f"{_option(name)}: swept through its own list keyword")
            overrides.append(Override(TrainGrid, name, list(value), _option(name)))
        else:
            overrides.append(Override(TrainConfig, name, value, _option(name)))
    return overrides


def sweep_overrides(fields: dict[str, Any]) -> list[Override]:
    """The sweep's own keywords (`towers=[1, 4]`, `seeds`, `budget`...), a single value taken
    as a list of one."""
    overrides = []
    for name in [name for name in fields if name in SweepGrid.model_fields]:
        value = fields.pop(name)
        if _is_list_field(SweepGrid, name) and not isinstance(value, list | tuple):
            value = [value]
        overrides.append(Override(SweepGrid, name, value, _option(name)))
    return overrides


def location_overrides(tracking_uri: str | None, data_dir: Path) -> list[Override]:
    overrides = [Override(DataConfig, "data_dir", Path(data_dir), _option("data_dir"))]
    if tracking_uri is not None:
        overrides.append(
            Override(TrackingConfig, "tracking_uri", tracking_uri, _option("tracking_uri"))
        )
    return overrides


def model_and_data(
    model: ModelArgument, data: DataArgument, name: str | None, data_dir: Path, project: Path
) -> tuple[dict[str, Any], str | None]:
    """`train:`'s model and dataset from the `model=` and `data=` arguments, and the data
    version when DVC built it: a function becomes a model file, arrays a preprocessed dataset
    (both under `data_dir`; through DVC's stages when `project` is a DVC project)."""
    fields: dict[str, Any] = {}
    version = None
    if callable(model):
        fields["model"] = function_file(model, data_dir, MODEL)
    elif model is not None:
        fields["model"] = model
    if isinstance(data, tuple | list):
        fields["dataset"], version = dataset_from_arrays(data, name, data_dir, project)
    elif data is not None:
        fields["dataset"] = data
    return fields, version


def load_params(
    params: str | Path | None, overrides: list[Override], resolve_tracking: bool = True
) -> Params:
    """The configuration: the params file (if any) with the keywords on top."""
    path = Path(params) if params is not None else None
    return load(path, overrides, resolve_tracking=resolve_tracking)


def _functions(value: Any) -> list[Any]:
    """The Python functions in a keyword's value: itself, or those of a swept list."""
    values = value if isinstance(value, list | tuple) else [value]
    return [item for item in values if callable(item)]


def given_functions(overrides: list[Override]) -> list[Override]:
    """The keywords given a Python function rather than a value (loss=, or a swept list
    holding one: loss=[mine, "mse"])."""
    return [override for override in overrides if _functions(override.value)]


def function_overrides(overrides: list[Override], data_dir: Path) -> list[Override]:
    """`overrides` with each function given as loss= (alone or in a swept list) made the loss
    file that imports it."""

    def written(value: Any) -> Any:
        return function_file(value, data_dir, LOSS) if callable(value) else value

    return [
        replace(
            override,
            value=[written(item) for item in override.value]
            if isinstance(override.value, list | tuple)
            else written(override.value),
        )
        if _functions(override.value)
        else override
        for override in overrides
    ]


def refuse_function_on_a_pool(
    model: ModelArgument, overrides: list[Override], params: Params
) -> None:
    """A pool's workers run on other hosts: they can import a file, not this process's function
    (model=, loss=); a function for any other keyword is refused here too."""
    functions = given_functions(overrides)
    for override in functions:
        if override.field != "loss":
            raise TowerbenchError(f"{override.option}: takes a value, not a Python function")
    role = MODEL if callable(model) else LOSS if functions else None
    if role is not None and params.sweep.pool is not None:
        raise TowerbenchError(
            f"{role.keyword}=: a function defined here cannot reach the workers of pool "
            f"{params.sweep.pool!r} on other hosts; put it in a file and pass "
            f"{role.keyword}='path/to/file.py:{role.name}'"
        )
