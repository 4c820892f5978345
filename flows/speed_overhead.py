"""Benchmark 6 of issue 5: what the Prefect flow + MLflow tracking add around one training run.

Both sides train the same configurations (one per seed) on the same TFRecords, interleaved
round by round:
  direct  `model.training.train(...)` called in this process for each;
  flow    the `sweep` flow of those configurations, exactly as `towerbench sweep` runs it:
          Prefect flow and task runs, MLflow parent and child runs, each training in its own
          process (for isolation; the next one started while the current one trains), live
          metrics, the evaluation artifacts and the report.
The overhead is per configuration: (flow - direct) / configurations.
An empty flow first starts Prefect's temporary server; the timed rounds reuse it, as they would
a running `prefect server`. Prefect and MLflow state go to a temporary folder. A third
candidate starts a Python process importing what the training process imports: the part of the
overhead that process isolation costs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from model.config import DataConfig, TrainConfig
from model.errors import TowerbenchError
from model.params import ReportConfig, SweepGrid, TrackingConfig
from speed.settings import BenchSettings
from speed.suite import write_synthetic_cifar
from speed.timing import interleaved, time_once

DATASET = "benchcifar"
TEST_EXAMPLES = 256


def isolate_orchestration_state(work_dir: Path) -> None:
    """Point Prefect (temporary server) and MLflow into `work_dir`; call before importing them."""
    prefect_home = work_dir / "prefect"
    prefect_home.mkdir(parents=True, exist_ok=True)  # its SQLite file is not created otherwise
    os.environ["PREFECT_HOME"] = str(prefect_home)
    os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    # The default 20 s is not enough for the server to start on a busy 2-core machine.
    os.environ["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] = "180"
    os.environ.pop("PREFECT_API_URL", None)
    os.environ.pop("MLFLOW_RUN_ID", None)
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{work_dir / 'mlflow.db'}"


def _start_prefect_server() -> None:
    """Run an empty flow, so Prefect's temporary server (~20-30 s to start) is up before timing."""
    from prefect import flow

    flow(name="bench-start-server")(lambda: None)()


def _start_training_process() -> None:
    """What the flow's one-process-per-configuration costs before training: a Python process
    importing TensorFlow, MLflow and the evaluation task (as tasks/train_worker.py does)."""
    subprocess.run(
        [sys.executable, "-c", "import tensorflow, mlflow, tasks.evaluate, model.training"],
        check=True,
        capture_output=True,
    )


def measure_orchestration_overhead(work_dir: Path, settings: BenchSettings) -> dict[str, Any]:
    """Median seconds of the direct calls and of the flow, and the overhead per configuration."""
    from flows.sweep import sweep
    from model.training import train

    data = DataConfig(data_dir=work_dir / "data")
    write_synthetic_cifar(
        data.data_dir, DATASET, settings.orchestration_train_examples, TEST_EXAMPLES
    )
    config = TrainConfig(
        dataset=DATASET, towers=1, global_batch=128, epochs=settings.orchestration_epochs
    )
    seeds = list(range(settings.orchestration_configurations))
    configs = [config.model_copy(update={"seed": seed}) for seed in seeds]
    grid = SweepGrid(
        towers=[1],
        seeds=seeds,
        aggregation=[config.aggregation],
        lr_scaling=[config.lr_scaling],
        warmup_epochs=[config.warmup_epochs],
    )
    tracking = TrackingConfig(tracking_uri=os.environ["MLFLOW_TRACKING_URI"])
    report = ReportConfig(report_dir=work_dir / "reports")

    def flow_run() -> None:
        outcome = sweep(train=config, sweep=grid, tracking=tracking, report=report, data=data)
        for run in outcome["configs"]:
            if run["status"] != "completed":
                raise TowerbenchError(
                    f"bench: the flow's training run {run['status']}: "
                    f"{run.get('error', 'no error message')}"
                )

    def direct_runs() -> None:
        for each in configs:
            train(each, data.data_dir)

    _start_prefect_server()
    timings = interleaved(
        {
            "direct": lambda: time_once(direct_runs),
            "flow": lambda: time_once(flow_run),
            "process_start": lambda: time_once(_start_training_process),
        },
        settings.orchestration_repeats,
        settings.orchestration_warmup,
    )
    direct, flow_seconds = timings["direct"].median, timings["flow"].median
    return {
        "process_start_seconds": timings["process_start"].median,
        "train_examples": settings.orchestration_train_examples,
        "epochs": settings.orchestration_epochs,
        "configurations": len(configs),
        "direct_seconds": direct,
        "flow_seconds": flow_seconds,
        "overhead_seconds": (flow_seconds - direct) / len(configs),
        "direct_repeats": list(timings["direct"].seconds),
        "flow_repeats": list(timings["flow"].seconds),
    }
