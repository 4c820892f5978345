"""Subcommands: pipeline, sweep, report, serve, ui (Prefect flows + MLflow tracking)."""

from __future__ import annotations

import argparse
import json
import os
import typing
from pathlib import Path
from typing import Any

from flows.options import add_model_options, build_model, values_from_args
from model.config import (
    SWEEP_AXES,
    DataConfig,
    Params,
    ReportConfig,
    SweepConfig,
    SweepGrid,
    TrackingConfig,
    TrainConfig,
    apply_sweep_preset,
)

# Prefect starts a temporary API server when none is configured; its default 20 s start-up
# budget is too short on a busy 2-core machine.
EPHEMERAL_STARTUP_SECONDS = "120"

TRAIN_LIST_FIELDS = frozenset(name for name in TrainConfig.model_fields if name not in SWEEP_AXES)
DEFAULT_PARAMS = Path("params.yaml")


def _prepare_prefect() -> None:
    os.environ.setdefault(
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", EPHEMERAL_STARTUP_SECONDS
    )


def _start_temporary_server() -> None:
    """Prefect's temporary server, when no API URL is set, as a process of ours."""
    from flows.temporary_server import start_owned_temporary_server

    start_owned_temporary_server()


def _tracking(args: argparse.Namespace, base: TrackingConfig) -> TrackingConfig:
    from tasks.tracking import resolve_tracking

    overrides = values_from_args(TrackingConfig, args)
    values = {**base.model_dump(exclude_unset=True), **overrides}
    if "tracking_uri" in overrides and "artifact_root" not in overrides:
        values.pop("artifact_root", None)  # it belonged to the replaced store
    return resolve_tracking(build_model(TrackingConfig, values))


def _split_training_values(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    """Training options with one value go to the shared base, with several to the sweep grid."""
    raw = values_from_args(TrainConfig, args, as_lists=TRAIN_LIST_FIELDS)
    base, grid = {}, {}
    for name, values in raw.items():
        if name in SWEEP_AXES:  # given through the sweep's own list options
            continue
        annotation = TrainConfig.model_fields[name].annotation
        values = [None if str(value).lower() == "none" else value for value in values]
        if typing.get_origin(annotation) is list or len(values) == 1:
            base[name] = values if typing.get_origin(annotation) is list else values[0]
        else:
            grid[name] = values
    return base, grid


def sweep_config_from_args(args: argparse.Namespace) -> SweepConfig:
    """The sweep the options describe, on top of `--params` (if given)."""
    base_values: dict[str, Any] = {}
    axes: dict[str, Any] = {}
    if args.params is not None:
        from flows.params import load_params

        params = load_params(args.params)
        base_values = params.train.model_dump(exclude_unset=True)
        axes = params.sweep.model_dump(exclude_unset=True)
    axis_values = values_from_args(SweepGrid, args)
    if "preset" in axis_values:  # the experiment's settings, under the other options given
        sections = apply_sweep_preset(
            {"train": base_values, "sweep": {**axes, "preset": axis_values["preset"]}}
        )
        base_values, axes = sections["train"], sections["sweep"]
    train_values, grid_values = _split_training_values(args)
    base = build_model(TrainConfig, {**base_values, **train_values})
    axes.update(axis_values)
    axes["grid"] = {**axes.get("grid", {}), **grid_values}
    return build_model(SweepConfig, {**axes, "base": base.model_dump()})


def _print_outcome(outcome: dict[str, Any], as_json: bool) -> int:
    for config in outcome["configs"]:
        accuracy = config.get("test_accuracy")
        shown = f"{accuracy:.4f}" if isinstance(accuracy, float) else "—"
        error = f"  ({config['error']})" if config.get("error") else ""
        print(f"{config['name']:<48} {config['status']:<9} test accuracy {shown}{error}")
    print(f"MLflow parent run: {outcome['parent_run_id']}")
    if as_json:
        summary = {
            "parent_run_id": outcome["parent_run_id"],
            "configs": [
                {key: config.get(key) for key in ("run_id", "towers", "seed", "status")}
                | {"test_accuracy": config.get("test_accuracy")}
                for config in outcome["configs"]
            ],
            "report": outcome["report"],
        }
        print(json.dumps(summary))
    else:
        print(f"Report: {outcome['report']}")
    return 0 if any(config["status"] != "failed" for config in outcome["configs"]) else 1


def run_sweep_command(args: argparse.Namespace) -> int:
    _prepare_prefect()
    from tasks.preflight import check_servers

    config = sweep_config_from_args(args)
    data = build_model(DataConfig, values_from_args(DataConfig, args))
    report = build_model(ReportConfig, values_from_args(ReportConfig, args))
    tracking = _tracking(args, TrackingConfig())
    check_servers(tracking.tracking_uri)  # before the slow imports and any training
    _start_temporary_server()
    from flows.sweep import sweep

    outcome = sweep(sweep=config, tracking=tracking, report=report, data=data, fresh=args.fresh)
    return _print_outcome(outcome, args.json)


def run_pipeline_command(args: argparse.Namespace) -> int:
    _prepare_prefect()
    from flows.params import load_params
    from tasks.preflight import check_servers

    params = load_params(args.params)
    config = params.pipeline(args.params.resolve().parent)
    config = config.model_copy(update={"tracking": _tracking(args, config.tracking)})
    check_servers(config.tracking.tracking_uri)
    _start_temporary_server()
    from flows.pipeline import pipeline

    return _print_outcome(pipeline(config=config, fresh=args.fresh), args.json)


def run_report_command(args: argparse.Namespace) -> int:
    from tasks.preflight import check_servers

    report = build_model(ReportConfig, values_from_args(ReportConfig, args))
    tracking = _tracking(args, TrackingConfig())
    check_servers(tracking.tracking_uri, prefect=False)  # the report needs MLflow only
    from tasks.report import write_report

    print(write_report(tracking, args.sweep, report))
    return 0


def _params_with_tracking(args: argparse.Namespace) -> Params:
    """params.yaml with the tracking options of the command line applied."""
    from flows.params import load_params

    params = load_params(args.params)
    return params.model_copy(update={"tracking": _tracking(args, params.tracking)})


def run_serve_command(args: argparse.Namespace) -> int:
    from flows.deployments import serve

    serve(_params_with_tracking(args), args.params.resolve().parent)
    return 0


def run_ui_command(args: argparse.Namespace) -> int:
    from flows.deployments import run_ui

    run_ui(_params_with_tracking(args), args.params)
    return 0


def _add_json(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json", action="store_true", help="End with one JSON line summarising the sweep."
    )
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
    pipeline.add_argument("--params", type=Path, default=DEFAULT_PARAMS, help="Params file.")
    add_model_options(pipeline, TrackingConfig)
    _add_json(pipeline)
    pipeline.set_defaults(handler=run_pipeline_command)

    sweep = subparsers.add_parser(
        "sweep",
        help="Train every combination of the given lists (comma-separated), then report.",
        description="Options accept comma-separated lists; each combination is one run.",
    )
    sweep.add_argument(
        "--params", type=Path, default=None, help="Start from this file's train: and sweep:."
    )
    add_model_options(sweep, SweepGrid, skip=frozenset({"grid"}))
    add_model_options(sweep, TrainConfig, skip=frozenset(SWEEP_AXES), as_lists=TRAIN_LIST_FIELDS)
    add_model_options(sweep, DataConfig)
    add_model_options(sweep, ReportConfig)
    add_model_options(sweep, TrackingConfig)
    _add_json(sweep)
    sweep.set_defaults(handler=run_sweep_command)

    report = subparsers.add_parser("report", help="Write the comparison report of a sweep.")
    report.add_argument(
        "--sweep", required=True, metavar="PARENT_RUN_ID", help="The sweep's MLflow parent run."
    )
    add_model_options(report, ReportConfig)
    add_model_options(report, TrackingConfig)
    report.set_defaults(handler=run_report_command)

    serve = subparsers.add_parser(
        "serve",
        help="Serve the pipeline (on demand) and benchmark (on its cron) deployments.",
    )
    serve.add_argument("--params", type=Path, default=DEFAULT_PARAMS, help="Params file.")
    add_model_options(serve, TrackingConfig)
    serve.set_defaults(handler=run_serve_command)

    ui = subparsers.add_parser(
        "ui", help="Local Prefect server (:4200), MLflow UI (:5000) and `towerbench serve`."
    )
    ui.add_argument("--params", type=Path, default=DEFAULT_PARAMS, help="Params file.")
    add_model_options(ui, TrackingConfig)
    ui.set_defaults(handler=run_ui_command)
