"""`towerbench bench --model file.py:function`: our tower step against Keras `fit` +
MirroredStrategy on the user's network.

Both sides build the network with the user's function (checked as `train` checks it; Keras builds
it inside the strategy's scope), for the same image shape, and step on the same fixed batch on
the same tower devices with the same precision and XLA setting: at 1 tower and at
`train.towers`, each at `train.global_batch` (the same work split k ways). Rounds interleave as
in the built-in benchmark and go on until each ratio's 95% interval is within ±`peer_precision`
or `max_step_seconds` have passed. There is no target: "never slower than Keras" is judged on
the built-in networks.

One exception to "the same XLA setting": Keras `fit` under MirroredStrategy with
`jit_compile=True` fails on more than one device (a variable of replica 1 read from device 0,
keras-team/keras#19005, measured here with TF 2.21 / Keras 3.15), so with `xla` its steps on
several towers run without XLA, and the summary says so (`keras_xla`).
"""

from __future__ import annotations

from typing import Any

from towerbench.config.model_ref import model_label
from towerbench.config.sections import TrainConfig
from towerbench.model.devices import TowerDevices
from towerbench.speed.keras_peer import keras_mirrored_runner
from towerbench.speed.results import StepTiming
from towerbench.speed.settings import BenchSettings
from towerbench.speed.steps import tower_step_runner
from towerbench.speed.suite import StepKey, step_records
from towerbench.speed.summary import TargetRow, interval_text, ratio_figure, step_ratio
from towerbench.speed.timing import interleaved
from towerbench.speed.workload import NUM_CLASSES

SIDES = ("towerbench", "keras_mirrored")
KERAS_XLA_NOTE = (
    "Keras fit + MirroredStrategy with jit_compile fails on more than one device "
    "(keras-team/keras#19005): its steps on several towers ran without XLA"
)


def tower_counts(config: TrainConfig) -> list[int]:
    """1 tower, and the configuration's towers."""
    return sorted({1, config.towers})


def _pair(config: TrainConfig, towers: int) -> tuple[StepKey, StepKey]:
    return ("towerbench", towers, config.global_batch), (
        "keras_mirrored",
        towers,
        config.global_batch,
    )


def keras_xla(config: TrainConfig, towers: int) -> bool:
    """Whether the Keras side compiles with XLA at `towers` (see the module's docstring)."""
    return config.xla and towers == 1


def measure_user_model(
    devices: TowerDevices,
    settings: BenchSettings,
    config: TrainConfig,
    image_shape: tuple[int, int, int],
) -> list[StepTiming]:
    """Seconds per step of both sides at each tower count, interleaved."""
    batch = config.global_batch
    steps = settings.steps_per_repeat(batch)
    runs = {}
    for towers in tower_counts(config):
        ours, keras = _pair(config, towers)
        # Ours is built first: a model the towers cannot train is refused before any step.
        runs[ours] = tower_step_runner(
            devices, towers, batch, steps, config, config.model, image_shape
        )
        runs[keras] = keras_mirrored_runner(
            devices.devices[:towers],
            batch,
            steps,
            config,
            config.model,
            image_shape,
            precision=config.precision,
            jit_compile=keras_xla(config, towers),
        )
    timings = interleaved(
        runs,
        settings.repeats,
        settings.warmup,
        pairs={_pair(config, k): settings.peer_precision for k in tower_counts(config)},
        max_seconds=settings.max_step_seconds,
    )
    return step_records(timings)


def user_model_summary(
    steps: list[StepTiming],
    config: TrainConfig,
    image_shape: tuple[int, int, int],
    machine: dict[str, Any],
) -> dict[str, Any]:
    """The JSON summary: what was timed, every step, our step / Keras' at each tower count
    and, with several towers, each side's k towers / 1 tower."""
    batch, most = config.global_batch, max(tower_counts(config))
    overhead = {
        side: ratio_figure(step_ratio(steps, (side, most, batch), (side, 1, batch)))
        for side in SIDES
        if most > 1
    }
    return {
        "model": config.model,
        "model_function": model_label(config.model),
        "image_shape": list(image_shape),
        "num_classes": NUM_CLASSES,
        "global_batch": batch,
        "precision": config.precision,
        "xla": config.xla,
        "keras_xla": {str(k): keras_xla(config, k) for k in tower_counts(config)},
        "steps": [step.model_dump() for step in steps],
        "vs_keras_mirrored": {
            str(k): ratio_figure(step_ratio(steps, *_pair(config, k))) for k in tower_counts(config)
        },
        "tower_overhead": overhead,
        "machine": machine,
    }


def user_model_rows(summary: dict[str, Any]) -> list[TargetRow]:
    """The measured ratios, each with its 95% interval and no target."""
    label, batch = summary["model_function"], summary["global_batch"]
    rows = [
        TargetRow(
            f"Our step / Keras fit + MirroredStrategy, `{label}`, {towers} tower(s), "
            f"global batch {batch}",
            "—",
            interval_text(figure),
            None,
        )
        for towers, figure in summary["vs_keras_mirrored"].items()
    ]
    towers = max(int(k) for k in summary["vs_keras_mirrored"])
    rows += [
        TargetRow(
            f"{side} step, {towers} towers / 1 tower, `{label}`, global batch {batch}",
            "—",
            interval_text(figure),
            None,
        )
        for side, figure in summary["tower_overhead"].items()
    ]
    return rows


def step_lines(summary: dict[str, Any]) -> list[str]:
    """Each side's median step at each tower count, and what ran without XLA."""
    note = [KERAS_XLA_NOTE] if summary["xla"] and not all(summary["keras_xla"].values()) else []
    return note + [
        f"{step['runner']:<15} {step['towers']} tower(s): {step['step_seconds'] * 1e3:.2f} ms "
        f"per step, {step['images_per_sec']:.0f} images/s "
        f"({sum(s is not None for s in step['repeats'])} rounds)"
        for step in summary["steps"]
    ]
