"""`towerbench bench`: tower overhead, Keras peer, roofline, input, preprocessing, orchestration;
with your own model (`--model file.py:function`), our step against Keras on that model."""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from towerbench.cli.console import CommandResult
from towerbench.cli.options import (
    add_json_option,
    add_model_options,
    add_params_option,
    option_name,
    overrides_from_args,
)
from towerbench.config.load import load
from towerbench.config.model_ref import parse_model
from towerbench.config.sections import DEFAULT_LOSS, TrainConfig
from towerbench.core.errors import TowerbenchError
from towerbench.core.native_logs import import_tensorflow
from towerbench.speed.results import BenchResults

DEFAULT_REPORT = Path("docs/benchmarks.md")
# The training settings given as options; the rest come from --params' train: section.
BENCH_FIELDS = frozenset({"model", "towers", "global_batch", "precision", "xla", "optimizer"})
# What only the comparison on your own model reads.
USER_MODEL_ONLY = ("towers", "global_batch", "image_shape")
DEFAULT_IMAGE_SHAPE = (24, 24, 3)  # the built-in workload's: CIFAR-10 after the tutorial's crop


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `bench`."""
    parser = subparsers.add_parser(
        "bench",
        help="Measure training speed, tower overhead and overheads against their targets.",
        description="Runs every benchmark of issue 5 in one process (11-21 minutes on 2 fast "
        "cores; --quick: 4-10, by the machine) on the towers' devices: physical GPUs, else "
        "logical CPU devices. "
        "The training settings benchmarked (aggregation, optimizer, schedule, distortions, XLA) "
        "are --params' train: section, else the defaults; the network is fixed. "
        "With your own model (--model file.py:function, or train.model) it times only our "
        "step against Keras fit + MirroredStrategy on that model: 1 tower and --towers, at "
        "--global-batch, --precision and --xla on both sides, with no target.",
    )
    add_model_options(parser, TrainConfig, only=BENCH_FIELDS)
    parser.add_argument(
        "--image-shape",
        metavar="H,W,C",
        default=argparse.SUPPRESS,
        help="Your own model: the image shape its function is called with and the random "
        "batches both sides step on are made of (default: 24,24,3, CIFAR-10 after the "
        "tutorial's crop).",
    )
    parser.add_argument(
        "--max-seconds",
        metavar="SECONDS",
        default=None,
        help="Seconds the extra step rounds, which narrow the ratios' intervals, may take "
        "(default: 900; --quick 150).",
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


def run_all(settings, config: TrainConfig, work_dir: Path) -> tuple[dict[str, Any], BenchResults]:
    """Every measurement of `config`'s training settings (aggregation, optimizer, schedule,
    distortions, XLA) on the fixed network, in one process; returns (JSON summary, raw results)."""
    from towerbench.overhead.orchestration import isolate_orchestration_state

    isolate_orchestration_state(work_dir)  # before Prefect or MLflow is imported
    import_tensorflow()
    # Devices before anything touches TensorFlow's runtime: one logical device per tower.
    from towerbench.model.devices import configure_tower_devices

    devices = configure_tower_devices(settings.max_towers, "auto", "cpu")
    import tensorflow as tf

    # Each benchmarked trainer traces its own step; TensorFlow's retracing warning is noise here.
    tf.get_logger().setLevel("ERROR")
    from towerbench.overhead.orchestration import measure_orchestration_overhead
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
    optimizer = config.optimizer_hyperparameters().describe()
    _say(f"{settings.mode} run on {machine['tower_devices']} devices ({machine['cpu']})")
    _say(f"optimizer in the timed steps: {optimizer}")
    flops = count_flops(config)
    _say("training steps (towerbench, Keras + MirroredStrategy) and matmul roofline")
    steps = measure_steps(devices, settings, config)
    _say("each layer's forward and backward pass")
    layers = measure_layers(devices, settings, config)
    _say("input pipeline")
    pipeline = measure_input_pipeline(work_dir, settings, config)
    _say("preprocessing")
    preprocess = measure_preprocessing(work_dir, settings)
    _say("orchestration: Prefect flow + MLflow against a direct train() call")
    results = BenchResults(
        **dict(steps),
        flops_per_example=flops,
        layers=layers,
        input_pipeline=pipeline,
        preprocess=preprocess,
        orchestration=measure_orchestration_overhead(work_dir, settings),
    )
    return {**speed_summary(results, machine, settings), "optimizer": optimizer}, results


def _image_shape(text: str) -> tuple[int, int, int]:
    """`H,W,C` as three positive integers; one line naming the option otherwise."""
    parts = [part.strip() for part in text.split(",")]
    if len(parts) != 3 or not all(part.isdigit() and int(part) > 0 for part in parts):
        raise TowerbenchError(
            f"--image-shape {text}: give height,width,channels as three positive integers"
        )
    return int(parts[0]), int(parts[1]), int(parts[2])


def _settings(args: argparse.Namespace):
    """The quick or full settings, with the cap of --max-seconds."""
    from towerbench.speed.settings import BenchSettings

    settings = BenchSettings.quick() if args.quick else BenchSettings.full()
    if args.max_seconds is None:
        return settings
    try:
        seconds = float(args.max_seconds)
    except ValueError:
        seconds = math.nan
    if not seconds >= 0:
        raise TowerbenchError(f"--max-seconds {args.max_seconds}: give seconds, 0 or more")
    return dataclasses.replace(settings, max_step_seconds=seconds)


def run_user_model_bench(args: argparse.Namespace, config: TrainConfig, settings) -> CommandResult:
    """Our step against Keras fit + MirroredStrategy on the user's model; no target."""
    if args.report is not None:
        raise TowerbenchError(
            "--report writes the built-in networks' page; with your own model use --json"
        )
    shape = _image_shape(getattr(args, "image_shape", ",".join(map(str, DEFAULT_IMAGE_SHAPE))))
    import_tensorflow()
    from towerbench.model.devices import configure_tower_devices

    devices = configure_tower_devices(config.towers, config.device_type, config.parameter_device)
    import tensorflow as tf

    tf.get_logger().setLevel("ERROR")  # every side traces its own step
    from towerbench.speed.machine import describe_machine
    from towerbench.speed.user_model import (
        measure_user_model,
        step_lines,
        user_model_rows,
        user_model_summary,
    )

    machine = describe_machine(devices)
    _say(
        f"{config.model} against Keras fit + MirroredStrategy on {machine['tower_devices']} "
        f"devices: images {'x'.join(map(str, shape))}, global batch {config.global_batch}, "
        f"{config.precision}{', XLA' if config.xla else ''}"
    )
    started = time.perf_counter()
    steps = measure_user_model(devices, settings, config, shape)
    summary = user_model_summary(steps, config, shape, machine)
    summary["optimizer"] = config.optimizer_hyperparameters().describe()
    for row in user_model_rows(summary):
        print(f"{row.figure:<78} {row.target:>7} {row.measured:>9}")
    for line in step_lines(summary):
        print(line)
    print(f"bench: {(time.perf_counter() - started) / 60:.1f} minutes")
    return CommandResult(0, summary)


def run_bench(args: argparse.Namespace) -> CommandResult:
    given = overrides_from_args(TrainConfig, args)
    # The step is timed with the default loss on class ids (its cost is the network's, not the
    # loss's): the benchmark's batches are synthetic images and class ids.
    loaded = load(args.params, given, resolve_tracking=False).train
    config = loaded.model_copy(update={"loss": DEFAULT_LOSS, "metric": "auto"})
    settings = _settings(args)
    if not parse_model(config.model).builtin:
        return run_user_model_bench(args, config, settings)
    for name in ("model", *USER_MODEL_ONLY):
        if hasattr(args, name):
            raise TowerbenchError(
                f"{option_name(name)} {getattr(args, name)}: the benchmark of the built-in "
                "networks is fixed (tutorial; tutorial_bn and resnet20 against Keras); "
                f"{option_name(name)} is for your own model (--model file.py:function)"
            )
    from towerbench.speed.report import render_markdown, write_markdown
    from towerbench.speed.summary import target_rows

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
