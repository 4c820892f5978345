"""The one loader: params.yaml (or the typed defaults) with the command line's values on top.

Every command builds its configuration through `load`; errors name the file and key, or the
option as the user typed it. Commands give their options by config model (`Override`), and where
each model sits in params.yaml is known here only (`SECTIONS`), so moving a section of `Params`
changes this module, not the commands' options.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from towerbench.config.losses import absolute_loss
from towerbench.config.model_ref import absolute_model, parse_model
from towerbench.config.optimizers import (
    ALL_HYPERPARAMETERS,
    DECOUPLED_WEIGHT_DECAY,
    DEFAULT_LEARNING_RATES,
    HYPERPARAMETERS,
)
from towerbench.config.params import (
    Params,
    ReportConfig,
    SweepGrid,
    TrackingConfig,
    TrainGrid,
    apply_sweep_preset,
)
from towerbench.config.sections import (
    DataConfig,
    FetchConfig,
    PreprocessConfig,
    TrainConfig,
    options_read_by,
)
from towerbench.config.tracking_uri import resolve_tracking as absolute_tracking
from towerbench.core.errors import Location, TowerbenchError, describe_validation_error, dotted

Key = tuple[str, ...]

# The key of params.yaml each config model is read from.
SECTIONS: dict[type[BaseModel], Key] = {
    FetchConfig: ("fetch",),
    PreprocessConfig: ("preprocess",),
    DataConfig: ("data",),
    TrainConfig: ("train",),
    SweepGrid: ("sweep",),
    TrainGrid: ("sweep", "grid"),
    TrackingConfig: ("tracking",),
    ReportConfig: ("report",),
}
DATA_DIR: Key = ("data", "data_dir")
REPORT_DIR: Key = ("report", "report_dir")
TRACKING_URI: Key = ("tracking", "tracking_uri")
ARTIFACT_ROOT: Key = ("tracking", "artifact_root")
PRESET: Key = ("sweep", "preset")
TRAIN_MODEL: Key = ("train", "model")
TRAIN_LOSS: Key = ("train", "loss")
WEIGHT_DECAY: Key = ("train", "weight_decay")
OPTIMIZER: Key = ("train", "optimizer")
BASE_LR: Key = ("train", "base_lr")
GRID_MODEL: Key = ("sweep", "grid", "model")
GRID_LOSS: Key = ("sweep", "grid", "loss")


@dataclass(frozen=True)
class Override:
    """One value given on the command line for a field of a config section."""

    section: type[BaseModel]
    field: str
    value: Any
    option: str  # as typed (`--towers`, `DATASET`), to name it in error messages

    @property
    def key(self) -> Key:
        return (*SECTIONS[self.section], self.field)


def override_at(dotted_key: str, value: Any, option: str) -> Override:
    """The override of params.yaml's `section.field` (e.g. `train.base_lr`), named `option`."""
    *section, field = dotted_key.split(".")
    for model, key in SECTIONS.items():
        if key == tuple(section) and field in model.model_fields:
            return Override(model, field, value, option)
    raise TowerbenchError(f"{option}: no setting {dotted_key!r} in params.yaml")


def read_sections(path: Path) -> dict[str, Any]:
    """The raw sections of a params file, with a clear error for a missing file or bad YAML."""
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        raise TowerbenchError(f"{path}: no such file") from None
    except yaml.YAMLError as error:
        raise TowerbenchError(_yaml_problem(path, error)) from None
    if not isinstance(raw, dict):
        raise TowerbenchError(f"{path}: expected sections (fetch:, train:, ...), got {raw!r}")
    if "benchmark" in raw and "nightly" not in raw:
        raw["nightly"] = raw.pop("benchmark")
        print(
            f"{path}: `benchmark:` is now `nightly:`; the old name is read until the next release",
            file=sys.stderr,
        )
    # A section with every key commented out is an empty section, not an error.
    return {name: {} if values is None else values for name, values in raw.items()}


def _yaml_problem(path: Path, error: yaml.YAMLError) -> str:
    """`FILE:LINE:COLUMN: not valid YAML: what (while what, from LINE:COLUMN)`, 1-based as
    editors count."""
    if not isinstance(error, yaml.MarkedYAMLError) or error.problem_mark is None:
        return f"{path}: not valid YAML: {str(error).splitlines()[0]}"
    mark = error.problem_mark
    where = f"{path}:{mark.line + 1}:{mark.column + 1}"
    context = ""
    if error.context and error.context_mark is not None:
        start = error.context_mark
        context = f" ({error.context}, from {start.line + 1}:{start.column + 1})"
    return f"{where}: not valid YAML: {error.problem}{context}"


def load(
    params_path: Path | None,
    overrides: Iterable[Override] = (),
    *,
    resolve_tracking: bool = True,
) -> Params:
    """The validated parameters: the file's (or the defaults), each override replacing its key.

    A `sweep.preset` (from the file or an option) writes its experiment over the file's `train:`
    and `sweep:` values; options given on the command line still win over it.

    Relative paths from the file are taken against the file's folder, those from the command line
    against the current directory: a served deployment runs in another directory and must find
    the same data, reports and MLflow store. `resolve_tracking=False` leaves the tracking section
    as written, for commands that never track (resolving it imports MLflow, which takes seconds).
    """
    overrides = list(overrides)
    raw = read_sections(params_path) if params_path is not None else {}
    for override in overrides:  # a preset named on the command line, before its values go in
        if override.key == PRESET:
            _section(raw, ("sweep",), params_path)["preset"] = override.value
    raw = apply_sweep_preset(raw)  # over the file's values; the options go over it
    given = {override.key for override in overrides}
    if TRACKING_URI in given and ARTIFACT_ROOT not in given:
        _section(raw, ("tracking",), params_path).pop("artifact_root", None)  # the old store's
    _drop_settings_of_the_files_optimizer(raw, overrides, params_path)
    for override in overrides:
        _section(raw, override.key[:-1], params_path)[override.field] = override.value
    try:
        params = Params.model_validate(raw)
    except ValidationError as error:
        name_of = _location_namer(params_path, {o.key: o.option for o in overrides})
        raise TowerbenchError(describe_validation_error(error, name_of)) from None
    _refuse_weight_decay_of_a_user_model(params, params_path, given)
    _refuse_hyperparameters_the_optimizer_ignores(params.train.optimizer, overrides)
    file_dir = params_path.resolve().parent if params_path is not None else None
    return _absolute_locations(params, file_dir, given, resolve_tracking, params_path)


def _drop_settings_of_the_files_optimizer(
    raw: dict[str, Any], overrides: list[Override], params_path: Path | None
) -> None:
    """An optimizer given on the command line (or a form) replaces the file's together with what
    the file tuned for it and the new one cannot use: a base_lr of another scale (the SGD
    family's against an adaptive optimizer's, or LARS') and hyperparameters it does not read.
    Each dropped setting is named on stderr."""
    chosen = next((o for o in overrides if o.key == OPTIMIZER), None)
    train = raw.get("train")
    if chosen is None or not isinstance(train, dict):
        return
    old = _files_optimizer(train)
    if old == chosen.value:
        return
    given = {override.key for override in overrides}
    dropped = [
        name
        for name in sorted(ALL_HYPERPARAMETERS - HYPERPARAMETERS.get(chosen.value, frozenset()))
        if name in train and ("train", name) not in given
    ]
    if "base_lr" in train and BASE_LR not in given:
        if DEFAULT_LEARNING_RATES.get(old) != DEFAULT_LEARNING_RATES.get(chosen.value):
            dropped.insert(0, "base_lr")
    for name in dropped:
        train.pop(name)
    if dropped:
        settings = ", ".join(f"train.{name}" for name in dropped)
        print(
            f"{chosen.option} {chosen.value}: {params_path}'s {settings} (set for {old}) "
            f"left out; {chosen.value} takes its own defaults",
            file=sys.stderr,
        )


def _files_optimizer(train: dict[str, Any]) -> str:
    """The optimizer the file's `train:` trains with, its dataset's or model's preset included."""
    chosen = {key: train[key] for key in ("model", "dataset", "optimizer") if key in train}
    try:
        return TrainConfig.model_validate(chosen).optimizer
    except ValidationError:  # the whole section is validated, and refused by name, later
        return str(train.get("optimizer", TrainConfig.model_fields["optimizer"].default))


def _refuse_weight_decay_of_a_user_model(
    params: Params, params_path: Path | None, given: set[Key]
) -> None:
    """`train.weight_decay` set (not by a preset) beside a user's model: that model's weight
    decay is its own regularizers', so the setting would be silently ignored (unless the
    optimizer decays the weights itself: adamw, lamb, lars)."""
    user_model = params.train.model
    if "weight_decay" not in params.train.model_fields_set or parse_model(user_model).builtin:
        return
    if params.train.optimizer in DECOUPLED_WEIGHT_DECAY:
        return
    where = "--weight-decay" if WEIGHT_DECAY in given else f"{params_path}: train.weight_decay"
    raise TowerbenchError(
        f"{where}: applies to the built-in networks only, not to {user_model}: your model's "
        "weight decay is its layers' kernel_regularizer, reported as the loss table's "
        "weight-decay term (with adamw, lamb or lars, weight_decay is the optimizer's own)"
    )


def _refuse_hyperparameters_the_optimizer_ignores(
    optimizer: str, overrides: list[Override]
) -> None:
    """A hyperparameter given as an option or keyword that the run's optimizer does not read,
    even at its default (`--optimizer adam --momentum 0.9`), would be silently ignored."""
    ignored = ALL_HYPERPARAMETERS - HYPERPARAMETERS[optimizer]
    given = [o for o in overrides if o.section is TrainConfig and o.field in ignored]
    if given:
        raise TowerbenchError(
            f"{given[0].option}: does not apply to --optimizer {optimizer} (it takes: "
            f"{options_read_by(optimizer)})"
        )


def _section(raw: dict[str, Any], key: Key, params_path: Path | None) -> dict[str, Any]:
    """The mapping at `key` in the raw sections, created if absent."""
    mapping = raw
    for depth, part in enumerate(key):
        mapping = mapping.setdefault(part, {})
        if not isinstance(mapping, dict):
            where = f"{params_path}: {dotted(key[: depth + 1])}"
            raise TowerbenchError(f"{where}: expected a mapping of keys, got {mapping!r}")
    return mapping


def _location_namer(params_path: Path | None, options: dict[Key, str]):
    """Names a location as the option that set it (`--epochs[1]`), else as the file's key."""

    def name_of(location: Location) -> str:
        for length in range(len(location), 0, -1):
            option = options.get(tuple(str(part) for part in location[:length]))
            if option is not None:
                rest = location[length:]
                return f"{option}[{dotted(rest)}]" if rest else option
        if params_path is None:
            return dotted(location)
        return f"{params_path}: {dotted(location)}" if location else str(params_path)

    return name_of


def _absolute_models(
    params: Params, base: Callable[[Key], Path], where: Callable[[Key], str]
) -> tuple[TrainConfig, SweepGrid]:
    """`train:` and `sweep:` with model and loss files made absolute against `base(key)`; one
    line naming the key (or option) when a file is missing."""

    def absolute(model: str, key: Key) -> str:
        try:
            if key in (TRAIN_LOSS, GRID_LOSS):
                return absolute_loss(model, base(key))
            return absolute_model(model, base(key))
        except ValueError as error:
            raise TowerbenchError(f"{where(key)}: {error}") from None

    train = params.train.model_copy(
        update={
            "model": absolute(params.train.model, TRAIN_MODEL),
            "loss": absolute(params.train.loss, TRAIN_LOSS),
        }
    )
    sweep = params.sweep
    # TrainGrid's fields are made at run time (create_model): the type checker cannot see them.
    grid_models: list[str] | None = sweep.grid.model  # type: ignore[attr-defined]
    grid_losses: list[str] | None = sweep.grid.loss  # type: ignore[attr-defined]
    grid: dict[str, list[str]] = {}
    if grid_models is not None:
        grid["model"] = [absolute(model, GRID_MODEL) for model in grid_models]
    if grid_losses is not None:
        grid["loss"] = [absolute(loss, GRID_LOSS) for loss in grid_losses]
    if grid:
        sweep = sweep.model_copy(update={"grid": sweep.grid.model_copy(update=grid)})
    return train, sweep


def _absolute_locations(
    params: Params,
    file_dir: Path | None,
    given: set[Key],
    resolve_tracking: bool,
    params_path: Path | None,
) -> Params:
    file_base = file_dir or Path.cwd()

    def absolute(key: Key, path: Path) -> Path:
        return (Path.cwd() if key in given else file_base) / path

    updates: dict[str, Any] = {
        "data": params.data.model_copy(
            update={"data_dir": absolute(DATA_DIR, params.data.data_dir)}
        ),
        "report": params.report.model_copy(
            update={"report_dir": absolute(REPORT_DIR, params.report.report_dir)}
        ),
    }
    updates["train"], updates["sweep"] = _absolute_models(
        params,
        lambda key: absolute(key, Path()),
        lambda key: (
            f"--{key[-1]}"
            if key in given or params_path is None
            else f"{params_path}: {dotted(key)}"
        ),
    )
    if resolve_tracking:
        base_dir = None if TRACKING_URI in given else file_dir
        updates["tracking"] = absolute_tracking(params.tracking, base_dir)
    return params.model_copy(update=updates)
