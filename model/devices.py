"""Which devices the towers run on: the one place that configures TensorFlow's devices.

`towers=k` gets k physical GPUs when the machine has at least k; otherwise one physical device
(the first GPU, or the CPU) is split into k logical devices. Splitting must happen before the
TensorFlow runtime initialises, so call `configure_tower_devices` before any other TF op.
If the runtime is already initialised (a test session that pre-split the CPU), the existing
logical devices are used when there are enough of them.

Names: "devices" are this process's tower devices; "replicas" is the global tower count,
workers x devices (model.cluster).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import tensorflow as tf

from towerbench.core.errors import TowerbenchError

DeviceKind = Literal["physical GPU", "logical GPU", "logical CPU"]

# Memory given to each logical GPU when one GPU is split (TensorFlow needs a fixed limit).
LOGICAL_GPU_MEMORY_MB = 2048


@dataclass(frozen=True)
class TowerDevices:
    """Where the towers and the variables live."""

    devices: list[str]  # one per local tower, e.g. "/device:CPU:1"
    parameter_device: str
    kind: DeviceKind
    replicas: int  # towers over all workers (== len(devices) for one worker)


@dataclass(frozen=True)
class DevicePlan:
    """What to split, decided from the device counts alone (testable without GPUs)."""

    device_type: Literal["GPU", "CPU"]
    kind: DeviceKind
    logical_devices: int  # logical devices to split the first physical device into (0: none)


def plan_devices(towers: int, device_type: str, physical_gpus: int) -> DevicePlan:
    """Choose physical GPUs, a split GPU or a split CPU for `towers` towers."""
    if towers < 1:
        raise TowerbenchError(f"--towers must be >= 1, got {towers}")
    if device_type == "gpu" and physical_gpus == 0:
        raise TowerbenchError("--device-type gpu: no GPU visible to TensorFlow")
    use_gpu = device_type == "gpu" or (device_type == "auto" and physical_gpus > 0)
    if not use_gpu:
        return DevicePlan("CPU", "logical CPU", towers)
    if physical_gpus >= towers:
        return DevicePlan("GPU", "physical GPU", 0)
    return DevicePlan("GPU", "logical GPU", towers)


def _split(physical: tf.config.PhysicalDevice, count: int, memory_mb: int | None) -> None:
    """Split `physical` into `count` logical devices unless it already has at least that many."""
    current = tf.config.get_logical_device_configuration(physical)
    if current is not None and len(current) >= count:
        return
    configs = [tf.config.LogicalDeviceConfiguration(memory_limit=memory_mb)] * count
    try:
        tf.config.set_logical_device_configuration(physical, configs)
    except RuntimeError:
        # The runtime is already initialised: use whatever logical devices it has (checked below).
        pass


def split_cpu(count: int) -> None:
    """Ask for `count` logical CPU devices without initialising the runtime (for test sessions
    that run several tower counts in one process); a no-op once the runtime is up."""
    _split(tf.config.list_physical_devices("CPU")[0], count, None)


def split_tower_devices(towers: int, device_type: str = "auto") -> DevicePlan:
    """Split the devices `towers` towers need, without initialising the runtime."""
    gpus = tf.config.list_physical_devices("GPU")
    plan = plan_devices(towers, device_type, len(gpus))
    if plan.device_type == "CPU":
        split_cpu(plan.logical_devices)
    elif plan.logical_devices:
        _split(gpus[0], plan.logical_devices, LOGICAL_GPU_MEMORY_MB)
    return plan


def configure_tower_devices(
    towers: int, device_type: str = "auto", parameter_device: str = "cpu", workers: int = 1
) -> TowerDevices:
    """Make `towers` tower devices available and name them (see the module docstring)."""
    gpus = tf.config.list_physical_devices("GPU")
    plan = split_tower_devices(towers, device_type)
    logical = [device.name for device in tf.config.list_logical_devices(plan.device_type)]
    if len(logical) < towers:
        raise TowerbenchError(
            f"--towers {towers}: only {len(logical)} {plan.device_type} device(s) available and "
            "TensorFlow's runtime is already initialised, so no more can be split off; "
            "run towerbench in a fresh process"
        )
    if parameter_device == "gpu0":
        if not gpus:
            raise TowerbenchError("--parameter-device gpu0: no GPU visible to TensorFlow")
        parameter = tf.config.list_logical_devices("GPU")[0].name
    elif parameter_device == "cpu":
        parameter = tf.config.list_logical_devices("CPU")[0].name
    else:
        raise TowerbenchError(f"--parameter-device must be cpu or gpu0, got {parameter_device!r}")
    return TowerDevices(
        devices=logical[:towers],
        parameter_device=parameter,
        kind=plan.kind,
        replicas=towers * workers,
    )
