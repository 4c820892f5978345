"""Runs the pure-TensorFlow benchmarks (1-5 of issue 5) and returns their raw medians.

All step-level candidates (our tower step at every tower count and batch, the Keras peer, the
matmul roofline) are timed round-robin in one group, so their ratios see the same machine load;
rounds go on until every judged ratio's 95% interval is within ±`precision` (or the time cap).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from towerbench.config.sections import PreprocessConfig, TrainConfig
from towerbench.ingest.write_records import write_dataset
from towerbench.model.devices import TowerDevices
from towerbench.model.networks import build_network
from towerbench.speed.flops import count_step_flops
from towerbench.speed.input_rate import pipeline_runner
from towerbench.speed.keras_peer import keras_mirrored_runner
from towerbench.speed.layers import layer_runners
from towerbench.speed.preprocess_rate import preprocess_runner, write_random_cifar10_archive
from towerbench.speed.results import (
    LayerTimes,
    PipelineRate,
    PreprocessRate,
    StepFlops,
    StepGroup,
    StepTiming,
)
from towerbench.speed.roofline import matmul_flops, matmul_runner
from towerbench.speed.settings import BenchSettings
from towerbench.speed.steps import tower_step_runner
from towerbench.speed.timing import Timing, interleaved
from towerbench.speed.workload import IMAGE_SHAPE, NETWORK, NUM_CLASSES

StepKey = tuple[str, int, int]  # (runner, towers, global batch)


def step_configurations(settings: BenchSettings) -> list[StepKey]:
    """Every (runner, towers, global batch) the step group times, without duplicates."""
    keys: list[StepKey] = []
    keys += [("towerbench", k, settings.fixed_global_batch) for k in settings.towers]
    keys += [("towerbench", k, k * settings.per_tower_batch) for k in settings.per_tower_towers]
    keys.append(("towerbench", 1, settings.roofline_batch))
    keys += [
        (f"towerbench:{option}", 1, settings.fixed_global_batch) for option in settings.options
    ]
    keys += [("keras_mirrored", k, k * settings.per_tower_batch) for k in settings.keras_towers]
    batch = settings.per_tower_batch
    for network in settings.keras_networks:
        keys += [(f"towerbench@{network}", 1, batch), (f"keras_mirrored@{network}", 1, batch)]
    return list(dict.fromkeys(keys))


def judged_pairs(settings: BenchSettings) -> dict[tuple[StepKey, StepKey], float]:
    """The (numerator, denominator) timings of every ratio a target judges, and of the other
    networks against Keras, each with the precision its interval must reach: the step group's
    extra rounds go to these until each is precise. (The options and 8 towers, without a
    target, keep the first rounds.)"""
    fixed, per_tower = settings.fixed_global_batch, settings.per_tower_batch
    pairs = {
        (("towerbench", k, fixed), ("towerbench", 1, fixed)): settings.precision
        for k in settings.judged_towers
        if k in settings.towers
    }
    for k in settings.keras_towers:
        key = ("towerbench", k, k * per_tower), ("keras_mirrored", k, k * per_tower)
        pairs[key] = settings.peer_precision
    for network in settings.keras_networks:
        key = (f"towerbench@{network}", 1, per_tower), (f"keras_mirrored@{network}", 1, per_tower)
        pairs[key] = settings.peer_precision
    for size in settings.roofline_sizes:
        key = ("matmul", 1, size), ("towerbench", 1, settings.roofline_batch)
        pairs[key] = settings.precision
    return pairs


def with_option(config: TrainConfig, option: str) -> TrainConfig:
    """`config` with a timed option on: `xla`, or a precision."""
    if option == "xla":
        return config.model_copy(update={"xla": True})
    return config.model_copy(update={"precision": option})


def step_records(timings: dict[StepKey, Timing]) -> list[StepTiming]:
    """Each timed step as the summary reads it: its median, images/s and every round."""
    return [
        StepTiming(
            runner=runner,
            towers=towers,
            global_batch=batch,
            step_seconds=timing.median,
            images_per_sec=batch / timing.median,
            repeats=list(timing.seconds),
        )
        for (runner, towers, batch), timing in timings.items()
    ]


def measure_steps(devices: TowerDevices, settings: BenchSettings, config: TrainConfig) -> StepGroup:
    """Seconds per step of every configuration and the matmul rates, interleaved."""
    runs = {}
    for runner, towers, batch in step_configurations(settings):
        steps = settings.steps_per_repeat(batch)
        kind, _, network = runner.partition("@")
        if kind.startswith("towerbench"):
            option = kind.partition(":")[2]
            variant = with_option(config, option) if option else config
            runs[(runner, towers, batch)] = tower_step_runner(
                devices, towers, batch, steps, variant, network or NETWORK
            )
        else:
            runs[(runner, towers, batch)] = keras_mirrored_runner(
                devices.devices[:towers], batch, steps, config, network or NETWORK
            )
    for size in settings.roofline_sizes:
        runs[("matmul", 1, size)] = matmul_runner(size, devices.devices[0])
    timings = interleaved(
        runs,
        settings.repeats,
        settings.warmup,
        pairs=judged_pairs(settings),
        max_seconds=settings.max_step_seconds,
    )
    timed = step_records({key: timing for key, timing in timings.items() if key[0] != "matmul"})
    roofline = {
        str(size): matmul_flops(size) / timings[("matmul", 1, size)].median
        for size in settings.roofline_sizes
    }
    matmul_seconds = {
        str(size): list(timings[("matmul", 1, size)].seconds) for size in settings.roofline_sizes
    }
    return StepGroup(steps=timed, matmul_flops_per_sec=roofline, matmul_seconds=matmul_seconds)


def measure_layers(
    devices: TowerDevices, settings: BenchSettings, config: TrainConfig
) -> LayerTimes:
    """Seconds per forward + backward pass of each layer at the roofline batch (1 device)."""
    batch = settings.roofline_batch
    runs = layer_runners(batch, settings.steps_per_repeat(batch), devices.devices[0], config)
    timings = interleaved(runs, settings.repeats, settings.warmup)
    return LayerTimes(
        batch=batch, seconds={name: timing.median for name, timing in timings.items()}
    )


def _random_images(count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(count, 32, 32, 3), dtype=np.uint8)
    return images, rng.integers(0, NUM_CLASSES, size=count)


def write_synthetic_cifar(folder: Path, name: str, train: int, test: int) -> Path:
    """TFRecords of random CIFAR-10-shaped images (the data contract's layout); their folder."""
    out_dir = folder / "tfrecords" / name
    write_dataset(
        out_dir,
        name,
        [f"class{index}" for index in range(NUM_CLASSES)],
        {"train": _random_images(train, 0), "test": _random_images(test, 1)},
        shards=PreprocessConfig().shards,
        source={"source": "random pixels (benchmark)"},
    )
    return out_dir


def measure_input_pipeline(
    work_dir: Path, settings: BenchSettings, config: TrainConfig
) -> PipelineRate:
    """Images/s of one training epoch of the input pipeline on random CIFAR-shaped TFRecords."""
    folder = write_synthetic_cifar(work_dir, "pipeline", settings.pipeline_examples, NUM_CLASSES)
    timing = interleaved(
        {"pipeline": pipeline_runner(folder, settings.per_tower_batch, config)},
        settings.repeats,
        settings.warmup,
    )["pipeline"]
    return PipelineRate(
        examples=settings.pipeline_examples,
        global_batch=settings.per_tower_batch,
        images_per_sec=1 / timing.median,
    )


def measure_preprocessing(work_dir: Path, settings: BenchSettings) -> PreprocessRate:
    """Seconds to convert an official-format CIFAR-10 binary archive (random pixels)."""
    archive = work_dir / "cifar-10-binary.tar.gz"
    images = write_random_cifar10_archive(archive, settings.preprocess_images_per_file)
    timing = interleaved(
        {"preprocess": preprocess_runner(archive, work_dir, PreprocessConfig().shards)},
        settings.repeats,
        settings.warmup,
    )["preprocess"]
    return PreprocessRate(
        images=images,
        seconds=timing.median,
        images_per_sec=images / timing.median,
        seconds_for_60k=timing.median * 60_000 / images,
        extrapolated=images != 60_000,
    )


def count_flops(config: TrainConfig) -> StepFlops:
    """Counted FLOPs per example of the benchmark network (see speed/flops.py)."""
    network = build_network(NETWORK, IMAGE_SHAPE, NUM_CLASSES, config.seed)
    return count_step_flops(lambda images: network.model(images, training=True), IMAGE_SHAPE)
