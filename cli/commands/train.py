"""`towerbench train` and `towerbench gradcheck`: the tower trainer from the command line."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from towerbench.cli.console import CommandResult
from towerbench.cli.options import (
    add_json_option,
    add_model_options,
    add_params_option,
    overrides_from_args,
)
from towerbench.config.load import Override, load
from towerbench.config.model_ref import parse_model
from towerbench.config.optimizers import OPTIMIZERS
from towerbench.config.sections import DataConfig, TrainConfig
from towerbench.core.dataset_lock import datasets_read
from towerbench.core.metrics import METRICS
from towerbench.core.native_logs import import_tensorflow
from towerbench.core.outcome import Status
from towerbench.model.cluster import TF_CONFIG, Cluster
from towerbench.model.records import EpochRecord
from towerbench.model.training_data import (
    check_training_data,
    distortions_note,
    refuse_built_in_pairs,
)
from towerbench.tasks.training.local_cluster import run_local_cluster

if TYPE_CHECKING:  # imported with TensorFlow, once the command runs
    from towerbench.model.gradcheck import GradcheckResult

# What gradcheck takes from the training configuration: the network, the towers, one batch.
GRADCHECK_FIELDS = frozenset(
    {"model", "dataset", "towers", "workers", "global_batch", "seed", "precision", "loss"}
    | {"temperature", "cross_tower"}
)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `train` and `gradcheck`."""
    train = subparsers.add_parser(
        "train",
        help="Train one configuration with k towers and report accuracy and speed.",
        description="Train on DATA_DIR/tfrecords/<dataset> (made by `towerbench preprocess`). "
        "Options not given take the params file's train: section, then the dataset's/model's "
        "preset, else the default; the resolved configuration is printed first. "
        "--workers N starts N worker processes here (ports on 127.0.0.1); with TF_CONFIG set, "
        "this process is that cluster's worker instead.",
    )
    add_params_option(train)
    add_model_options(train, TrainConfig)
    add_model_options(train, DataConfig)
    train.add_argument(
        "--checkpoint-dir",
        type=Path,
        default=None,
        help="Save checkpoints here and resume from the latest one in it.",
    )
    add_json_option(train, "the run's final metrics and configuration")
    train.set_defaults(handler=run_train)

    gradcheck = subparsers.add_parser(
        "gradcheck",
        help="Show that averaged tower gradients equal one device's (and MirroredStrategy's).",
        description="One fixed batch through one device, k towers averaged, k towers summed and "
        "MirroredStrategy; with --workers N also N worker processes of k towers each, averaged "
        "across workers. Your own model gets images of the dataset's shape (after cropping) "
        "and its classes when DATA_DIR/tfrecords/<dataset> is preprocessed, else 32x32x3. "
        "Options not given take the params file's train: section, else the default.",
    )
    add_params_option(gradcheck)
    add_model_options(gradcheck, TrainConfig, only=GRADCHECK_FIELDS)
    add_model_options(gradcheck, DataConfig)
    add_json_option(gradcheck, "the comparison")
    gradcheck.set_defaults(handler=run_gradcheck_command)


def _describe_config(config: TrainConfig, data_dir: Path) -> str:
    presets = config.preset_fields()
    lines = ["configuration: " + json.dumps(config.model_dump(mode="json"))]
    if presets:
        shown = ", ".join(f"{name}={value}" for name, value in presets.items())
        lines.append(f"presets for {config.model}/{config.dataset}: {shown}")
    note = distortions_note(config, data_dir)  # distortions off for data other than images
    if note is not None:
        lines.append(note)
    return "\n".join(lines)


def _adascale_text(gain: float | None, tau: float | None) -> str:
    """`  gain 3.42  tau 540` under lr_scaling adascale (tau in reference steps), else empty."""
    return "" if gain is None or tau is None else f"  gain {gain:.2f}  tau {tau:.0f}"


class _Progress:
    """Epoch lines always; a live line rewritten in place when stdout is a terminal."""

    def __init__(self):
        self.stream = sys.stdout
        self.live = self.stream.isatty()

    def on_progress(self, metrics: dict[str, float]) -> None:
        if self.live:
            self.stream.write(
                f"\r  epoch {metrics['epoch']:6.2f}  step {int(metrics['step']):6d}  "
                f"loss {metrics['total_loss']:.4f}{_train_accuracy(metrics['train_accuracy'])}  "
                f"{metrics['images_per_sec']:8.0f} img/s  lr {metrics['lr']:.4g}"
                f"{_adascale_text(metrics.get('adascale_gain'), metrics.get('adascale_tau'))}   "
            )
            self.stream.flush()

    def on_epoch(self, record: EpochRecord) -> None:
        if self.live:
            self.stream.write("\r" + " " * 100 + "\r")
        test = record.test_metric
        tested = (
            ""
            if math.isnan(test)
            else (f"  test {test:.4f}  ema test {record.ema_test_metric:.4f}")
        )
        noise = record.noise_scale
        noise_text = "" if noise is None or math.isnan(noise) else f"  B_noise {noise:.0f}"
        print(
            f"epoch {record.epoch:6.2f}  step {record.step:6d}  "
            f"loss {record.cross_entropy:.4f}  weight decay "
            f"{record.weight_decay_loss:.4f}  total {record.total_loss:.4f}  "
            f"{_train_accuracy(record.train_accuracy, 4).lstrip()}{tested}  "
            f"{record.images_per_sec:.0f} img/s  lr {record.lr:.4g}{noise_text}"
            f"{_adascale_text(record.adascale_gain, record.adascale_tau)}",
            file=self.stream,
            flush=True,
        )


def _train_overrides(args: argparse.Namespace, fields: frozenset[str] | None = None) -> list:
    """The options given; in a TF_CONFIG cluster `--workers` defaults to its size."""
    overrides = overrides_from_args(TrainConfig, args)
    if os.environ.get(TF_CONFIG) and not hasattr(args, "workers"):
        workers = Cluster.from_environment().workers
        overrides.append(Override(TrainConfig, "workers", workers, TF_CONFIG))
    return [item for item in overrides if fields is None or item.field in fields]


def _run_local_cluster(args: argparse.Namespace, workers: int) -> CommandResult:
    """This command once per worker, on this machine; the chief's output is the result."""
    chief_lines: list[str] = []

    def on_chief_line(line: str) -> None:
        if args.json:
            chief_lines.append(line)
        else:
            print(line, end="", flush=True)

    command = [sys.executable, "-m", "towerbench.cli.main", *args.argv]
    outcome = run_local_cluster(command, workers, on_chief_line)
    for failure in outcome.failures():
        print(f"towerbench {args.command}: {failure}", file=sys.stderr)
    document = json.loads("".join(chief_lines)) if args.json and "".join(chief_lines) else {}
    return CommandResult(outcome.status, document)


def _lr_text(config: TrainConfig, effective_lr: float) -> str:
    if config.lr_scaling == "adascale":
        return f"LR {effective_lr:.4g} (base LR {config.base_lr:g} x mean gain)"
    return f"peak LR {effective_lr:.4g}"


def run_train(args: argparse.Namespace) -> CommandResult:
    overrides = _train_overrides(args) + overrides_from_args(DataConfig, args)
    params = load(args.params, overrides, resolve_tracking=False)
    config = params.train
    # The data's errors, damaged shards too, before TensorFlow loads and N processes start.
    check_training_data([config], params.data.data_dir)
    if config.workers > 1 and not os.environ.get(TF_CONFIG):
        return _run_local_cluster(args, config.workers)
    print(_describe_config(config, params.data.data_dir), flush=True)
    import_tensorflow()
    from towerbench.model.training import train

    progress = _Progress()
    with datasets_read(params.data.data_dir, [config.dataset]):
        result = train(
            config,
            params.data.data_dir,
            args.checkpoint_dir,
            progress.on_epoch,
            progress.on_progress,
        )
    final = result.final
    across = f" on each of {config.workers} workers" if config.workers > 1 else ""
    print(
        f"{result.status}: test {METRICS[final.metric].label} {final.test_metric:.4f} "
        f"(EMA {final.ema_test_metric:.4f}) on {final.test_examples} test examples; "
        f"{final.images_per_sec:.0f} images/s; {config.towers} tower(s){across} on "
        f"{final.device_kind} devices {', '.join(final.device_names)}, variables on "
        f"{final.parameter_device}; global batch {final.global_batch}, "
        f"{_lr_text(config, final.effective_lr)}; {final.wall_time:.1f} s",
        flush=True,
    )
    summary = {
        "status": result.status,
        **final.to_dict(),
        "config": config.model_dump(mode="json"),
        "presets": config.preset_fields(),
        "classes": result.classes,
    }
    return CommandResult(0 if result.status == Status.COMPLETED else 1, summary)


def _train_accuracy(value: float, digits: int = 3) -> str:
    """`  train acc 0.912`, or nothing for a run not judged by accuracy (NaN)."""
    return "" if math.isnan(value) else f"  train acc {value:.{digits}f}"


def gradcheck_images(config: TrainConfig, data_dir: Path) -> tuple[dict, str]:
    """What gradcheck feeds a user's model (run_gradcheck's `input_shape`, `num_classes`) and
    why: the dataset's shape after cropping and its classes when it is preprocessed."""
    from towerbench.core.tfrecord_format import MANIFEST_NAME, dataset_dir, load_manifest
    from towerbench.model.input_pipeline import network_input_shape

    if parse_model(config.model).builtin:
        return {}, "the network's own input shape"
    folder = dataset_dir(data_dir, config.dataset)
    if not (folder / MANIFEST_NAME).is_file():
        return {}, f"32x32x3, 10 classes: no preprocessed {config.dataset!r} in {data_dir}"
    manifest = load_manifest(folder)
    shape = network_input_shape(manifest.features, config.crop_size)
    classes = len(manifest.classes)
    why = f"{'x'.join(map(str, shape))}, {classes} classes: the shape {config.dataset!r} feeds"
    given = {"input_shape": shape, "num_classes": classes, "labels": manifest.labels}
    return {**given, "integer_inputs": manifest.features.integer}, why


def run_gradcheck_command(args: argparse.Namespace) -> CommandResult:
    overrides = _train_overrides(args, GRADCHECK_FIELDS) + overrides_from_args(DataConfig, args)
    params = load(args.params, overrides, resolve_tracking=False)
    config = params.train
    if config.workers > 1 and not os.environ.get(TF_CONFIG):
        return _run_local_cluster(args, config.workers)
    import_tensorflow()
    import tensorflow as tf

    from towerbench.model.gradcheck import run_gradcheck

    tf.get_logger().setLevel("ERROR")  # four trainers on one batch: retracing warnings are noise
    cluster = Cluster.from_environment(config.collective_timeout)
    refuse_built_in_pairs(config)
    images, why = gradcheck_images(config, params.data.data_dir)
    result = run_gradcheck(
        config.model,
        config.towers,
        config.global_batch,
        config.seed,
        cluster,
        config.precision,
        **images,
        optimizers=OPTIMIZERS,
        loss=config.loss,
        temperature=config.temperature,
        cross_tower=config.cross_tower,
    )
    if result is None:  # a worker other than the chief: the chief reports
        return CommandResult(0, {})
    print(
        f"{config.model}: {config.towers} tower(s) on {result.device_kind} devices, "
        f"global batch {config.global_batch}, loss {config.loss}; images {why}"
    )
    _print_per_variable(result)
    _print_comparisons(result, config)
    verdict = "agree" if result.passed else "DO NOT agree"
    print(f"within the tolerance {result.tolerance:g}: the ways {verdict}")
    print(result.explanation)
    return CommandResult(0, {**result.to_json(), "images": why})


def _print_per_variable(result: GradcheckResult) -> None:
    """Each variable's relative gradient difference from one device: towers, MirroredStrategy."""
    header = f"{'variable':32s} {'mean vs single':>16s} {'mirrored vs single':>20s}"
    print(header + "   (relative difference of gradients ||a-b||inf/||b||inf)")
    for mean, mirrored in zip(
        result.mean_vs_single.per_variable, result.mirrored_vs_single.per_variable, strict=True
    ):
        print(f"{mean.variable:32s} {mean.grad_rel_diff:16.2e} {mirrored.grad_rel_diff:20.2e}")


def _print_comparisons(result: GradcheckResult, config: TrainConfig) -> None:
    """Each comparison's largest differences, of the gradients and of the weights after one
    step; the workers' in a cluster; summing against averaging."""
    compared = {
        "mean_vs_single": result.mean_vs_single,
        "mirrored_vs_single": result.mirrored_vs_single,
        "mirrored_vs_mean": result.mirrored_vs_mean,
        "ghost_vs_mean": result.ghost_vs_mean,
    }
    for name, item in compared.items():
        print(
            f"{name}: gradients max abs {item.max_abs_diff:.2e}, max rel "
            f"{item.max_rel_diff:.2e}; weights after one step max abs "
            f"{item.weights_max_abs_diff:.2e}, max rel {item.weights_max_rel_diff:.2e}"
        )
    if result.workers_vs_single is not None:
        item = result.workers_vs_single
        print(
            f"workers_vs_single ({config.workers} workers x {config.towers} towers): gradients "
            f"max abs {item.max_abs_diff:.2e}, max rel {item.max_rel_diff:.2e}; weights "
            f"after one step max rel {item.weights_max_rel_diff:.2e}"
        )
    print(
        f"loss_vs_shards: per-example losses of each tower's shard against the batch's, max rel "
        f"{result.loss_vs_shards:.2e}"
    )
    summed = result.sum_vs_mean
    print(
        f"sum_vs_mean: ratio {summed.ratio:.6f} (expected {config.towers}), "
        f"max rel diff from k x mean {summed.max_rel_diff_from_k_times_mean:.2e}"
    )
    for check in result.updates_vs_single:
        print(
            f"updates_vs_single {check.optimizer:8s} (LR {check.learning_rate:g}, {check.steps} "
            f"steps): weights max abs {check.max_abs_diff:.2e}, max rel {check.max_rel_diff:.2e}"
        )
