"""towerbench from Python: `train`, `sweep`, `advise` and `gradcheck` on your function and arrays.

    import towerbench
    result = towerbench.sweep(model=build, data=keras.datasets.mnist.load_data(),
                              towers=[1, 4], seeds=[0, 1, 2], epochs=5)
    result.to_frame()

Each function loads the configuration as the command line does (params.yaml's fields by name as
keywords), then calls the same flows; errors are a `TowerbenchError` with the CLI's one line.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from towerbench.api.inputs import (
    DataArgument,
    ModelArgument,
    function_overrides,
    given_functions,
    load_params,
    location_overrides,
    model_and_data,
    refuse_function_on_a_pool,
    sweep_overrides,
    train_overrides,
)
from towerbench.api.results import TrainResult, train_result
from towerbench.api.session import orchestrated
from towerbench.config.advise import AdviseConfig, check_verifiable
from towerbench.config.grid import expand
from towerbench.config.load import Override
from towerbench.config.params import Params, SweepGrid
from towerbench.core.errors import TowerbenchError
from towerbench.core.outcome import NothingTrained, SweepResult
from towerbench.model.training_data import check_training_data
from towerbench.serve.startup import sweep_lock

if TYPE_CHECKING:  # the advise flow's modules load when advise is called
    from towerbench.tasks.advise.advice import Advice


@dataclass(frozen=True)
class _Configuration:
    """What a call runs: the params with every keyword on top, those keywords as the loader's
    overrides, and the data version when DVC built the arrays."""

    params: Params
    overrides: list[Override]
    data_version: str | None


def _configuration(
    model: ModelArgument,
    data: DataArgument,
    name: str | None,
    params: str | Path | None,
    tracking_uri: str | None,
    data_dir: str | Path | None,
    overrides: list[Override],
) -> _Configuration:
    located = load_params(params, [], resolve_tracking=False)
    folder = Path(data_dir) if data_dir is not None else located.data.data_dir
    project = Path(params).resolve().parent if params is not None else Path.cwd()
    locations = location_overrides(tracking_uri, folder)
    # The keywords checked before a model or loss file or the arrays are written: a refused
    # call leaves nothing behind.
    values = [override for override in overrides if override not in given_functions(overrides)]
    refuse_function_on_a_pool(model, overrides, load_params(params, [*locations, *values], False))
    given, version = model_and_data(model, data, name, folder, project)
    written = function_overrides(overrides, folder)
    everything = [*locations, *train_overrides(given), *written]
    return _Configuration(load_params(params, everything), everything, version)


def _say(lines: list[str]) -> None:
    """A call's results and verdicts, after its progress (the flows log them for the UI only)."""
    for line in lines:
        print(line, flush=True)


def _sweep(params: Params, fresh: bool, data_version: str | None, verbose: bool) -> SweepResult:
    from towerbench.flows.sweep import sweep_params

    check_training_data(expand(params.train, params.sweep), params.data.data_dir)
    # A second start of a live sweep is refused before Prefect's temporary server starts.
    with sweep_lock(params), orchestrated(params, verbose):
        try:
            result = sweep_params(params, fresh=fresh, data_version=data_version)
        except NothingTrained as error:  # what it recorded, then the error
            if isinstance(error.result, SweepResult):
                _say(error.result.summary_lines())
            raise
    _say(result.summary_lines())
    return result


def sweep(
    model: ModelArgument = None,
    data: DataArgument = None,
    *,
    name: str | None = None,
    params: str | Path | None = None,
    tracking_uri: str | None = None,
    data_dir: str | Path | None = None,
    fresh: bool = False,
    verbose: bool = False,
    **fields: Any,
) -> SweepResult:
    """Train every combination of the sweep's lists (`towers=[1, 4]`, `seeds=[0, 1, 2]`, ...;
    a list for another field sweeps it too) and report; the same call again resumes.
    `verbose=True` shows Prefect's per-epoch logs and TensorFlow's C++ logging too."""
    lists = sweep_overrides(fields)
    overrides = lists + train_overrides(fields, lists_to_grid=True)
    run = _configuration(model, data, name, params, tracking_uri, data_dir, overrides)
    return _sweep(run.params, fresh, run.data_version, verbose)


def train(
    model: ModelArgument = None,
    data: DataArgument = None,
    *,
    name: str | None = None,
    params: str | Path | None = None,
    tracking_uri: str | None = None,
    data_dir: str | Path | None = None,
    fresh: bool = False,
    verbose: bool = False,
    **fields: Any,
) -> TrainResult:
    """Train one configuration (`towers=4`, `epochs=5`, ...) in a process of its own, tracked in
    MLflow as a sweep of one run; the same call again resumes it."""
    overrides = train_overrides(fields)
    run = _configuration(model, data, name, params, tracking_uri, data_dir, overrides)
    one = run.params.train
    axes = {
        "towers": [one.towers],
        "workers": [one.workers],
        "aggregation": [one.aggregation],
        "lr_scaling": [one.lr_scaling],
        "warmup_epochs": [one.warmup_epochs],
        "seeds": [one.seed],
        "budget": "epochs",
        "per_tower_batch": None,
        "grid": {},
        "preset": None,
    }
    alone = [Override(SweepGrid, field, value, "train()") for field, value in axes.items()]
    single = load_params(params, [*run.overrides, *alone])
    result = _sweep(single, fresh, run.data_version, verbose)
    from towerbench.tasks.tracking import client_for

    return train_result(result, client_for(single.tracking))


def advise(
    model: ModelArgument = None,
    data: DataArgument = None,
    *,
    towers: int,
    name: str | None = None,
    params: str | Path | None = None,
    tracking_uri: str | None = None,
    data_dir: str | Path | None = None,
    fresh: bool = False,
    verbose: bool = False,
    **fields: Any,
) -> Advice:
    """The recipe for `towers` towers from a short probe, verified by a sweep of `seeds` seeds
    unless `verify=False`: `towerbench advise` (its `Advice`; `.keras(train_examples=N)` takes
    the recipe home to your own `model.fit`)."""
    chosen = {key: fields.pop(key) for key in list(fields) if key in AdviseConfig.model_fields}
    try:
        advice = AdviseConfig.model_validate({"towers": towers, **chosen})
    except ValueError as error:
        raise TowerbenchError(f"advise: {str(error).splitlines()[-1].strip()}") from None
    run = _configuration(model, data, name, params, tracking_uri, data_dir, train_overrides(fields))
    check_verifiable(advice, run.params)
    from towerbench.flows.advise import advise as advise_flow

    with orchestrated(run.params, verbose):
        result = advise_flow(
            advice=advice,
            params_file=str(params) if params is not None else None,
            advanced={".".join(item.key): item.value for item in run.overrides},
            fresh=fresh,
        )
    _say(result.summary_lines())
    return result


def gradcheck(
    model: ModelArgument = None,
    data: DataArgument = None,
    *,
    name: str | None = None,
    params: str | Path | None = None,
    data_dir: str | Path | None = None,
    verbose: bool = False,
    **fields: Any,
) -> Any:
    """`towerbench gradcheck` (towers=, global_batch=, ...) in a process of its own (TensorFlow
    fixes its devices once per process): its `GradcheckResult`."""
    run = _configuration(model, data, name, params, None, data_dir, train_overrides(fields))
    options = [f"--{item.field.replace('_', '-')}={item.value}" for item in run.overrides]
    command = [sys.executable, "-m", "towerbench.cli.main", "gradcheck", "--json", *options]
    command += ["--verbose"] if verbose else []
    if params is not None:
        command += ["--params", str(params)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines() or [f"exit status {done.returncode}"]
        raise TowerbenchError(lines[-1].removeprefix("towerbench gradcheck: error: "))
    from towerbench.model.gradcheck import GradcheckResult

    document = json.loads(done.stdout)
    document.pop("images", None)
    return GradcheckResult.model_validate(document)
