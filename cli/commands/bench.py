"""`towerbench bench`: tower overhead, Keras peer, roofline, input, preprocessing, orchestration."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from towerbench.cli.console import CommandResult, import_tensorflow
from towerbench.cli.options import add_json_option, add_params_option
from towerbench.config.load import load
from towerbench.config.sections import TrainConfig

DEFAULT_REPORT = Path("docs/benchmarks.md")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `bench`."""
    parser = subparsers.add_parser(
        "bench",
        help="Measure training speed, tower overhead and overheads against their targets.",
        description="Runs every benchmark of issue 5 in one process (11-21 minutes on 2 fast "
        "cores; --quick: 4-10, by the machine) on the towers' devices: physical GPUs, else "
        "logical CPU devices. "
        "The training settings benchmarked (aggregation, optimizer, schedule, distortions, XLA) "
        "are --params' train: section, else the defaults; the network is fixed.",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="Fewer steps and images (same keys); no report unless --report.",
    )
    add_params_option(parser)
    add_json_option(parser, "the summary")
    parser.add_argument(
        "--report",
        type=Path,
        default=None,
        help=f"Markdown report to write (default: {DEFAULT_REPORT} for a full "
        "run, none for --quick).",
    )
    parser.set_defaults(handler=run_bench)


def _say(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def run_all(settings, config: TrainConfig, work_dir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Every measurement of `config`'s training settings (aggregation, optimizer, schedule,
    distortions, XLA) on the fixed network, in one process; returns (JSON summary, raw results)."""
    from towerbench.bench.overhead import isolate_orchestration_state

    isolate_orchestration_state(work_dir)  # before Prefect or MLflow is imported
    import_tensorflow()
    # Devices before anything touches TensorFlow's runtime: one logical device per tower.
    from towerbench.model.devices import configure_tower_devices

    devices = configure_tower_devices(settings.max_towers, "auto", "cpu")
    import tensorflow as tf

    # Each benchmarked trainer traces its own step; TensorFlow's retracing warning is noise here.
    tf.get_logger().setLevel("ERROR")
    from towerbench.bench.overhead import measure_orchestration_overhead
    from towerbench.speed.machine import describe_machine
    from towerbench.speed.suite import (
        count_flops,
        measure_input_pipeline,
        measure_layers,
        measure_preprocessing,
        measure_steps,
    )
    from towerbench.speed.summary import speed_summary

    machine = describe_machine(devices)
    _say(f"{settings.mode} run on {machine['tower_devices']} devices ({machine['cpu']})")
    results: dict[str, Any] = {"flops_per_example": count_flops(config)}
    _say("training steps (towerbench, Keras + MirroredStrategy) and matmul roofline")
    results |= measure_steps(devices, settings, config)
    _say("each layer's forward and backward pass")
    results["layers"] = measure_layers(devices, settings, config)
    _say("input pipeline")
    results["input_pipeline"] = measure_input_pipeline(work_dir, settings, config)
    _say("preprocessing")
    results["preprocess"] = measure_preprocessing(work_dir, settings)
    _say("orchestration: Prefect flow + MLflow against a direct train() call")
    results["orchestration"] = measure_orchestration_overhead(work_dir, settings)
    return speed_summary(results, results["orchestration"], machine, settings), results


def run_bench(args: argparse.Namespace) -> CommandResult:
    config = load(args.params, resolve_tracking=False).train
    from towerbench.speed.report import render_markdown, write_markdown
    from towerbench.speed.settings import BenchSettings
    from towerbench.speed.summary import target_rows

    settings = BenchSettings.quick() if args.quick else BenchSettings.full()
    report = args.report or (None if args.quick else DEFAULT_REPORT)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="towerbench-bench-") as work:
        summary, results = run_all(settings, config, Path(work))
    seconds = time.perf_counter() - started
    for row in target_rows(summary, settings):
        verdict = {True: "met", False: "MISSED", None: ""}[row.met]
        print(f"{row.figure:<78} {row.target:>7} {row.measured:>9}  {verdict}")
    if report is not None:
        write_markdown(report, render_markdown(summary, results, settings, seconds))
        print(f"report: {report}")
    print(f"bench: {seconds / 60:.1f} minutes")
    return CommandResult(0, summary)
