"""A description of the machine a benchmark ran on, for the report and the JSON summary."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

import psutil
import tensorflow as tf

from towerbench.model.devices import TowerDevices


def cpu_model() -> str:
    """The CPU's marketing name (Linux), else whatever the platform reports."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def describe_machine(devices: TowerDevices) -> dict[str, Any]:
    """CPU, cores, memory, GPUs, versions, the tower devices and the load when this is called."""
    gpus = tf.config.list_physical_devices("GPU")
    return {
        "cpu": cpu_model(),
        "logical_cpus": os.cpu_count(),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "gpus": [gpu.name for gpu in gpus],
        "tower_devices": f"{len(devices.devices)} x {devices.kind}",
        "parameter_device": devices.parameter_device,
        "os": platform.platform(),
        "python": platform.python_version(),
        "tensorflow": tf.__version__,
        "load_average_1m": round(os.getloadavg()[0], 2),
    }
