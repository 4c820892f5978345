"""`towerbench advise`: the recipe for K towers from a short probe, checked by a sweep."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from pydantic import ValidationError

from towerbench.cli.console import CommandResult
from towerbench.cli.options import (
    add_json_option,
    add_model_options,
    add_params_option,
    option_name,
    overrides_from_args,
    values_from_args,
)
from towerbench.config.advise import AdviseConfig, check_verifiable
from towerbench.config.load import load
from towerbench.config.params import ReportConfig, TrackingConfig
from towerbench.config.sections import DataConfig, TrainConfig
from towerbench.core.errors import TowerbenchError, describe_validation_error
from towerbench.core.outcome import NothingTrained
from towerbench.core.tfrecord_format import MANIFEST_NAME, dataset_dir
from towerbench.serve.startup import prepare_prefect

if TYPE_CHECKING:
    from towerbench.tasks.advise.advice import Advice

CHOSEN = frozenset({"model", "dataset", "optimizer"})  # what advise takes from train: here


def advice_from_args(args: argparse.Namespace) -> AdviseConfig:
    """The advise options, validated (one line naming the option)."""
    try:
        return AdviseConfig.model_validate(values_from_args(AdviseConfig, args))
    except ValidationError as error:
        name_of = lambda location: option_name(str(location[0])) if location else "advise"  # noqa: E731
        raise TowerbenchError(describe_validation_error(error, name_of)) from None


def run_advise_command(args: argparse.Namespace) -> CommandResult:
    advice = advice_from_args(args)
    overrides = [
        override
        for model in (TrainConfig, DataConfig, ReportConfig, TrackingConfig)
        for override in overrides_from_args(model, args)
    ]
    params = load(args.params, overrides)
    check_verifiable(advice, params)  # before Prefect loads and anything trains
    folder = dataset_dir(params.data.data_dir, params.train.dataset)
    if not (folder / MANIFEST_NAME).is_file():
        raise TowerbenchError(
            f"--dataset {params.train.dataset}: no preprocessed data in {folder}; run "
            f"`towerbench preprocess {params.train.dataset} --data-dir {params.data.data_dir}` "
            "first"
        )
    prepare_prefect(params)
    from towerbench.flows.advise import advise
    from towerbench.tasks.advise.advice import Advice

    advanced = {".".join(override.key): override.value for override in overrides}
    params_file = str(args.params) if args.params is not None else None
    try:
        result = advise(advice=advice, params_file=params_file, advanced=advanced, fresh=args.fresh)
    except NothingTrained as error:  # every recipe run diverged: its verdict is the error line
        if not isinstance(error.result, Advice):
            raise
        return _advised(error.result, failure=str(error))
    return _advised(result)


def _advised(result: Advice, failure: str | None = None) -> CommandResult:
    """The probe's lines, the recipe and the verdict (unless it is the `failure` line)."""
    for line in result.summary_lines(with_verdict=failure is None):
        print(line)
    return CommandResult(0 if failure is None else 1, result.model_dump(mode="json"), failure)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `advise`."""
    parser = subparsers.add_parser(
        "advise",
        help="Find the LR recipe for K towers from a short 1-tower probe, then check it.",
        description="A short probe on the model and data (the noise scale, the largest stable "
        "LR at the K-tower batch, BatchNorm or not) chooses the scaling rule, warmup, budget and "
        "schedule, each printed with the number that decided it; the recipe is written as "
        "advise-<id>.yaml in the report folder and logged to MLflow. --verify (the default) "
        "then trains 1 tower against K towers with the recipe for S seeds (a sweep, with its "
        "report) and ends with one verdict.",
    )
    add_params_option(parser)
    add_model_options(parser, AdviseConfig)
    add_model_options(parser, TrainConfig, only=CHOSEN)
    add_model_options(parser, DataConfig)
    add_model_options(parser, ReportConfig)
    add_model_options(parser, TrackingConfig)
    add_json_option(parser, "the probe, the recipe and the verdict")
    parser.add_argument(
        "--fresh",
        action="store_true",
        help="Probe and verify anew even if an identical advise was interrupted (default: reuse "
        "its finished probe and recipe file, resume its verification).",
    )
    parser.set_defaults(handler=run_advise_command)
