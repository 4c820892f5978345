"""`towerbench train` and `towerbench gradcheck`: the tower trainer from the command line."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from flows.options import add_model_options, build_model, values_from_args
from model.config import DataConfig, TrainConfig
from model.records import EpochRecord


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `train` and `gradcheck`."""
    train = subparsers.add_parser(
        "train",
        help="Train one configuration with k towers and report accuracy and speed.",
        description="Train on DATA_DIR/tfrecords/<dataset> (made by `towerbench preprocess`). "
        "Options not given take the dataset's/model's preset, else the default; the resolved "
        "configuration is printed first.",
    )
    add_model_options(train, TrainConfig)
    train.add_argument(
        "--data-dir",
        type=Path,
        default=DataConfig().data_dir,
        help=DataConfig.model_fields["data_dir"].description,
    )
    train.add_argument(
        "--checkpoint-dir",
        type=Path,
        default=None,
        help="Save checkpoints here and resume from the latest one in it.",
    )
    train.add_argument("--json", action="store_true", help="Print a JSON summary as the last line.")
    train.set_defaults(handler=run_train)

    gradcheck = subparsers.add_parser(
        "gradcheck",
        help="Show that averaged tower gradients equal one device's (and MirroredStrategy's).",
    )
    gradcheck.add_argument("--towers", type=int, required=True, help="Towers (k >= 1).")
    gradcheck.add_argument(
        "--global-batch",
        type=int,
        required=True,
        help="Examples in the fixed batch (a multiple of --towers).",
    )
    gradcheck.add_argument(
        "--model",
        choices=("tutorial", "resnet20"),
        default="tutorial",
        help="Network (default: tutorial).",
    )
    gradcheck.add_argument("--seed", type=int, default=0, help="Seed of weights and batch.")
    gradcheck.add_argument(
        "--json", action="store_true", help="Print the result as JSON on the last line."
    )
    gradcheck.set_defaults(handler=run_gradcheck_command)


def _describe_config(config: TrainConfig) -> str:
    presets = config.preset_fields()
    lines = ["configuration: " + json.dumps(config.model_dump(mode="json"))]
    if presets:
        shown = ", ".join(f"{name}={value}" for name, value in presets.items())
        lines.append(f"presets for {config.model}/{config.dataset}: {shown}")
    return "\n".join(lines)


class _Progress:
    """Epoch lines always; a live line rewritten in place when stdout is a terminal."""

    def __init__(self):
        self.stream = sys.stdout
        self.live = self.stream.isatty()

    def on_progress(self, metrics: dict[str, float]) -> None:
        if self.live:
            self.stream.write(
                f"\r  epoch {metrics['epoch']:6.2f}  step {int(metrics['step']):6d}  "
                f"loss {metrics['total_loss']:.4f}  train acc {metrics['train_accuracy']:.3f}  "
                f"{metrics['images_per_sec']:8.0f} img/s  lr {metrics['lr']:.4g}   "
            )
            self.stream.flush()

    def on_epoch(self, record: EpochRecord) -> None:
        if self.live:
            self.stream.write("\r" + " " * 100 + "\r")
        test = record.test_accuracy
        tested = (
            ""
            if math.isnan(test)
            else (f"  test {test:.4f}  ema test {record.ema_test_accuracy:.4f}")
        )
        noise = record.noise_scale
        noise_text = "" if noise is None or math.isnan(noise) else f"  B_noise {noise:.0f}"
        print(
            f"epoch {record.epoch:6.2f}  step {record.step:6d}  "
            f"cross-entropy {record.cross_entropy:.4f}  weight decay "
            f"{record.weight_decay_loss:.4f}  total {record.total_loss:.4f}  "
            f"train acc {record.train_accuracy:.4f}{tested}  "
            f"{record.images_per_sec:.0f} img/s  lr {record.lr:.4g}{noise_text}",
            file=self.stream,
            flush=True,
        )


def run_train(args: argparse.Namespace) -> int:
    from model.training import train

    config = build_model(TrainConfig, values_from_args(TrainConfig, args))
    print(_describe_config(config), flush=True)
    progress = _Progress()
    result = train(
        config, args.data_dir, args.checkpoint_dir, progress.on_epoch, progress.on_progress
    )
    final = result.final
    print(
        f"{result.status}: test accuracy {final.test_accuracy:.4f} "
        f"(EMA {final.ema_test_accuracy:.4f}) on {final.test_examples} test examples; "
        f"{final.images_per_sec:.0f} images/s; {config.towers} tower(s) on "
        f"{final.device_kind} devices {', '.join(final.device_names)}, variables on "
        f"{final.parameter_device}; global batch {final.global_batch}, "
        f"peak LR {final.effective_lr:.4g}; {final.wall_time:.1f} s",
        flush=True,
    )
    if args.json:
        summary: dict[str, Any] = {
            "status": result.status,
            **final.to_dict(),
            "config": config.model_dump(mode="json"),
            "presets": config.preset_fields(),
            "classes": result.classes,
        }
        print(json.dumps(summary))
    return 0 if result.status == "completed" else 1


def run_gradcheck_command(args: argparse.Namespace) -> int:
    import tensorflow as tf

    from model.gradcheck import run_gradcheck

    tf.get_logger().setLevel("ERROR")  # four trainers on one batch: retracing warnings are noise
    result = run_gradcheck(args.model, args.towers, args.global_batch, args.seed)
    print(
        f"{args.model}: {args.towers} tower(s) on {result['device_kind']} devices, "
        f"global batch {args.global_batch}"
    )
    header = f"{'variable':32s} {'mean vs single':>16s} {'mirrored vs single':>20s}"
    print(header + "   (relative difference of gradients ||a-b||inf/||b||inf)")
    for mean, mirrored in zip(
        result["mean_vs_single"]["per_variable"],
        result["mirrored_vs_single"]["per_variable"],
        strict=True,
    ):
        print(
            f"{mean['variable']:32s} {mean['grad_rel_diff']:16.2e} "
            f"{mirrored['grad_rel_diff']:20.2e}"
        )
    for key in ("mean_vs_single", "mirrored_vs_single"):
        item = result[key]
        print(
            f"{key}: gradients max abs {item['max_abs_diff']:.2e}, max rel "
            f"{item['max_rel_diff']:.2e}; weights after one step max abs "
            f"{item['weights_max_abs_diff']:.2e}, max rel {item['weights_max_rel_diff']:.2e}"
        )
    summed = result["sum_vs_mean"]
    print(
        f"sum_vs_mean: ratio {summed['ratio']:.6f} (expected {args.towers}), "
        f"max rel diff from k x mean {summed['max_rel_diff_from_k_times_mean']:.2e}"
    )
    print(result["explanation"])
    if args.json:
        print(json.dumps(result))
    return 0
