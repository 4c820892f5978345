"""Subcommands: pipeline, sweep, report, serve, ui (Prefect flows + MLflow tracking)."""

from __future__ import annotations

import argparse
import sys
import typing
from collections.abc import Callable
from pathlib import Path

from towerbench.cli.console import CommandResult
from towerbench.cli.options import (
    add_json_option,
    add_model_options,
    add_params_option,
    option_name,
    overrides_from_args,
    values_from_args,
)
from towerbench.config.grid import expand
from towerbench.config.load import Override, load
from towerbench.config.params import (
    SWEEP_AXES,
    Params,
    ReportConfig,
    SweepGrid,
    TrackingConfig,
    TrainGrid,
)
from towerbench.config.sections import DataConfig, TrainConfig
from towerbench.config.tracking_uri import check_store_exists
from towerbench.core.outcome import NothingTrained, SweepResult
from towerbench.model.training_data import check_training_data
from towerbench.serve.startup import prepare_prefect, sweep_lock
from towerbench.tasks.data.dvc_stages import check_dvc_project

TRAIN_LIST_FIELDS = frozenset(name for name in TrainConfig.model_fields if name not in SWEEP_AXES)
DEFAULT_PARAMS = Path("params.yaml")


def _training_overrides(args: argparse.Namespace) -> list[Override]:
    """Training options with one value set `train:`, with several the sweep's grid."""
    overrides = []
    for name, values in values_from_args(TrainConfig, args, as_lists=TRAIN_LIST_FIELDS).items():
        if name in SWEEP_AXES:  # given through the sweep's own list options
            continue
        is_list = typing.get_origin(TrainConfig.model_fields[name].annotation) is list
        values = [None if str(value).lower() == "none" else value for value in values]
        if is_list or len(values) == 1:
            overrides.append(
                Override(TrainConfig, name, values if is_list else values[0], option_name(name))
            )
        else:
            overrides.append(Override(TrainGrid, name, values, option_name(name)))
    return overrides


def _checked(params: Params) -> Params:
    """`params`, once an invalid combination of the sweep's lists is refused (here, before
    Prefect is loaded)."""
    expand(params.train, params.sweep)
    return params


def sweep_run_from_args(args: argparse.Namespace) -> Params:
    """What `towerbench sweep` runs: `--params` (if given) with the options on top."""
    overrides = [
        *overrides_from_args(SweepGrid, args),
        *_training_overrides(args),
        *overrides_from_args(DataConfig, args),
        *overrides_from_args(ReportConfig, args),
        *overrides_from_args(TrackingConfig, args),
    ]
    return _checked(load(args.params, overrides))


JSON_FIELDS = {
    *("run_id", "towers", "workers", "seed", "status", "worker"),
    *("metric", "test_metric", "test_accuracy"),  # test_accuracy: runs judged by accuracy
    *("epochs", "steps"),  # as trained
}


def _result(outcome: SweepResult, failure: str | None = None) -> CommandResult:
    """The sweep's lines on stdout and its `--json` document; status 1 with `failure` (no
    configuration completed)."""
    for line in outcome.summary_lines():
        print(line)
    document = outcome.model_dump(
        mode="json",
        include={
            "parent_run_id": True,
            "report": True,
            "verdicts": True,
            "configs": {"__all__": JSON_FIELDS},
        },
    )
    return CommandResult(0 if failure is None else 1, document, failure)


def _swept(run: Callable[[], SweepResult]) -> CommandResult:
    """`run`'s result; a sweep whose every configuration failed or diverged still prints what it
    recorded, then its one error line (status 1)."""
    try:
        return _result(run())
    except NothingTrained as error:
        if not isinstance(error.result, SweepResult):
            raise
        return _result(error.result, str(error))


def run_sweep_command(args: argparse.Namespace) -> CommandResult:
    params = sweep_run_from_args(args)
    # Each dataset there, suiting every configuration, its shards intact: before anything starts.
    check_training_data(expand(params.train, params.sweep), params.data.data_dir)
    # A second start of a live sweep is refused before Prefect's temporary server starts.
    with sweep_lock(params):
        prepare_prefect(params)
        from towerbench.flows.sweep import sweep_params

        return _swept(lambda: sweep_params(params, fresh=args.fresh))


def run_pipeline_command(args: argparse.Namespace) -> CommandResult:
    """The deployment's flow, with the form's values taken from the file and the options."""
    overrides = overrides_from_args(TrackingConfig, args)
    params = _checked(load(args.params, overrides))
    check_dvc_project(args.params.parent)  # before Prefect starts: 20 s saved on a wrong folder
    prepare_prefect(params)
    from towerbench.config.run_form import form_parameters
    from towerbench.flows.pipeline import pipeline

    form = form_parameters(params, args.params)
    form["advanced"] = {".".join(override.key): override.value for override in overrides}
    return _swept(lambda: pipeline(**form, fresh=args.fresh))


def _params_with_options(args: argparse.Namespace) -> Params:
    """The params file with the report and tracking options given applied."""
    overrides = overrides_from_args(ReportConfig, args) + overrides_from_args(TrackingConfig, args)
    return load(args.params, overrides)


def run_report_command(args: argparse.Namespace) -> int:
    params = _params_with_options(args)
    check_store_exists(params.tracking.tracking_uri)  # before MLflow and Prefect load
    from towerbench.tasks.preflight import check_servers

    check_servers(params.tracking.tracking_uri, prefect=False)
    from towerbench.tasks.report import write_report

    def say(note: str) -> None:  # a sweep still running: a partial report, and why
        print(f"towerbench report: {note}", file=sys.stderr)

    print(write_report(params.tracking, args.sweep, params.report, say))
    return 0


def run_serve_command(args: argparse.Namespace) -> int:
    params = _params_with_options(args)
    from towerbench.serve.deployments import serve

    serve(params, args.params)
    return 0


def run_ui_command(args: argparse.Namespace) -> int:
    params = _params_with_options(args)
    from towerbench.serve.deployments import run_ui

    run_ui(params, args.params)
    return 0


def _add_fresh_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--fresh",
        action="store_true",
        help="Start a new sweep even if an identical one was interrupted (default: resume it).",
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add this module's subcommands."""
    pipeline = subparsers.add_parser(
        "pipeline", help="fetch -> preprocess (DVC) -> sweep -> report, as set in params.yaml."
    )
    add_params_option(pipeline, DEFAULT_PARAMS)
    add_model_options(pipeline, TrackingConfig)
    add_json_option(pipeline, "the sweep's runs and report")
    _add_fresh_option(pipeline)
    pipeline.set_defaults(handler=run_pipeline_command)

    sweep = subparsers.add_parser(
        "sweep",
        help="Train every combination of the given lists (comma-separated), then report.",
        description="Options accept comma-separated lists; each combination is one run.",
    )
    add_params_option(sweep)
    add_model_options(sweep, SweepGrid, skip=frozenset({"grid"}))
    add_model_options(sweep, TrainConfig, skip=frozenset(SWEEP_AXES), as_lists=TRAIN_LIST_FIELDS)
    add_model_options(sweep, DataConfig)
    add_model_options(sweep, ReportConfig)
    add_model_options(sweep, TrackingConfig)
    add_json_option(sweep, "the sweep's runs and report")
    _add_fresh_option(sweep)
    sweep.set_defaults(handler=run_sweep_command)

    report = subparsers.add_parser("report", help="Write the comparison report of a sweep.")
    report.add_argument(
        "--sweep", required=True, metavar="PARENT_RUN_ID", help="The sweep's MLflow parent run."
    )
    add_params_option(report)
    add_model_options(report, ReportConfig)
    add_model_options(report, TrackingConfig)
    report.set_defaults(handler=run_report_command)

    serve = subparsers.add_parser(
        "serve",
        help="Serve the pipeline and advise (on demand) and nightly (on its cron) deployments.",
    )
    add_params_option(serve, DEFAULT_PARAMS)
    add_model_options(serve, TrackingConfig)
    serve.set_defaults(handler=run_serve_command)

    ui = subparsers.add_parser(
        "ui", help="Local Prefect server (:4200), MLflow UI (:5000) and `towerbench serve`."
    )
    add_params_option(ui, DEFAULT_PARAMS)
    add_model_options(ui, TrackingConfig)
    ui.set_defaults(handler=run_ui_command)
