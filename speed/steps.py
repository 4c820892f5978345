"""Step time of towerbench's own tower trainer (model/towers.py), on a fixed in-memory batch."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

import tensorflow as tf

from towerbench.config.sections import TrainConfig
from towerbench.model.devices import TowerDevices
from towerbench.model.networks import build_network
from towerbench.model.schedules import StepSchedule, schedule_from_config
from towerbench.model.towers import tower_trainer
from towerbench.speed.workload import IMAGE_SHAPE, NETWORK, NUM_CLASSES, synthetic_batch

# CIFAR-10's 50,000 training images at the tutorial's batch: only the schedule's shape uses it.
STEPS_PER_EPOCH = 390


def tower_step_runner(
    devices: TowerDevices,
    towers: int,
    global_batch: int,
    steps: int,
    config: TrainConfig,
    network_name: str = NETWORK,
    image_shape: tuple[int, ...] = IMAGE_SHAPE,
) -> Callable[[], float]:
    """A callable that runs `steps` tower steps on the first `towers` devices; seconds per step.
    The network is built for `image_shape` (a user's one is checked there, model.user_model)."""
    tower_devices = replace(devices, devices=devices.devices[:towers], replicas=towers)
    with tf.device(tower_devices.parameter_device):
        network = build_network(
            network_name, image_shape, NUM_CLASSES, config.seed, config.precision
        )
    # The configured optimizer, as model/training.py builds it, on the epoch-counted schedule.
    at_batch = config.model_copy(update={"global_batch": global_batch})
    learning_rate = StepSchedule(schedule_from_config(config, global_batch), STEPS_PER_EPOCH)
    trainer = tower_trainer(network, at_batch, tower_devices, learning_rate)
    images, labels = synthetic_batch(global_batch, config.seed, image_shape)

    def run() -> float:
        start = time.perf_counter()
        for _ in range(steps):
            loss = trainer.step(images, labels)
        loss.numpy()  # wait for the last step
        return (time.perf_counter() - start) / steps

    return run
