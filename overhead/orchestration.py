"""Benchmark 6 of issue 5: what the Prefect flow + MLflow tracking add around one training run.

Both sides train the same configurations (one per seed) on the same TFRecords, interleaved
round by round:
  direct  `model.training.train(...)` called in this process for each;
  flow    the `sweep` flow of those configurations, exactly as `towerbench sweep` runs it:
          Prefect flow and task runs, MLflow parent and child runs, each training in its own
          process (for isolation; forked from the fork server, which imported TensorFlow and
          MLflow once), live metrics, the evaluation artifacts and the report.
The overhead is per configuration: (flow - direct) / configurations.
An empty flow first starts Prefect's temporary server, and the fork server is started; the timed
rounds reuse both, as a sweep command's flow does (the command starts both before its flow, the
fork server's imports overlapping Prefect's start-up). Prefect and MLflow state go to a temporary
folder. A third candidate starts a Python process importing what the fork server imports: its
start-up, paid once per command, outside the figure like Prefect's.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from towerbench.config.params import ReportConfig, SweepGrid, TrackingConfig
from towerbench.config.sections import DataConfig, TrainConfig
from towerbench.core.errors import TowerbenchError
from towerbench.core.outcome import Status
from towerbench.speed.results import FlowBreakdown, OrchestrationTiming
from towerbench.speed.settings import BenchSettings
from towerbench.speed.suite import write_synthetic_cifar
from towerbench.speed.timing import interleaved, time_once
from towerbench.tasks.training.fork_server import start_fork_server

DATASET = "benchcifar"
TEST_EXAMPLES = 256
# Prefect's default 20 s is not enough on a busy 2-core machine (seen: a timeout at 21 s).
SERVER_STARTUP_SECONDS = 180


def isolate_orchestration_state(work_dir: Path) -> None:
    """Point Prefect (temporary server) and MLflow into `work_dir`; call before importing them."""
    prefect_home = work_dir / "prefect"
    prefect_home.mkdir(parents=True, exist_ok=True)  # its SQLite file is not created otherwise
    os.environ["PREFECT_HOME"] = str(prefect_home)
    os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    os.environ.pop("PREFECT_API_URL", None)
    os.environ.pop("MLFLOW_RUN_ID", None)
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{work_dir / 'mlflow.db'}"


def _start_prefect_server() -> None:
    """Start Prefect's temporary server as the commands do (~20-30 s; longer while the fork
    server imports beside it), then run an empty flow, so both are up before timing."""
    from prefect import flow

    from towerbench.serve.temporary_server import start_owned_temporary_server

    start_owned_temporary_server(SERVER_STARTUP_SECONDS)
    flow(name="bench-start-server")(lambda: None)()


TRAINING_MODULES = "towerbench.tasks.training.evaluate, towerbench.model.training"


def _start_training_process() -> None:
    """What the flow's one-process-per-configuration costs before training: a Python process
    importing TensorFlow, MLflow and the evaluation task (as tasks/training/worker.py does)."""
    subprocess.run(
        [
            sys.executable,
            "-c",
            "import tensorflow, mlflow, towerbench.tasks.training.evaluate,"
            " towerbench.model.training",
        ],
        check=True,
        capture_output=True,
    )


def flow_breakdown(tracking: TrackingConfig, flow: dict[str, Any]) -> FlowBreakdown:
    """Where a flow's seconds went, from its MLflow runs' start and end times: before the first
    configuration's run starts (flow and parent run set-up), inside the configurations' runs
    (training, live logging, evaluation artifacts), between them (a run ends, the next is opened)
    and after the last (report, parent run closed)."""
    from mlflow import MlflowClient

    from towerbench.tasks.tracking import children_filter

    client = MlflowClient(tracking.tracking_uri)
    parent = client.get_run(flow["parent"])
    children = client.search_runs(
        [parent.info.experiment_id],
        filter_string=children_filter(flow["parent"]),
        order_by=["attributes.start_time ASC"],
    )
    spans = [(run.info.start_time / 1e3, run.info.end_time / 1e3) for run in children]
    return FlowBreakdown(
        before_first_run=spans[0][0] - flow["started"],
        in_runs=sum(end - start for start, end in spans),
        between_runs=sum(later[0] - earlier[1] for earlier, later in itertools.pairwise(spans)),
        after_last_run=flow["ended"] - spans[-1][1],
    )


def _training_data(work_dir: Path, settings: BenchSettings) -> DataConfig:
    """Random CIFAR-shaped TFRecords for both sides to train on."""
    data = DataConfig(data_dir=work_dir / "data")
    write_synthetic_cifar(
        data.data_dir, DATASET, settings.orchestration_train_examples, TEST_EXAMPLES
    )
    return data


def _one_config_per_seed(config: TrainConfig, seeds: list[int]) -> SweepGrid:
    """The sweep of `config` at each seed, and nothing else varied."""
    return SweepGrid(
        towers=[1],
        seeds=seeds,
        aggregation=[config.aggregation],
        lr_scaling=[config.lr_scaling],
        warmup_epochs=[config.warmup_epochs],
    )


def measure_orchestration_overhead(work_dir: Path, settings: BenchSettings) -> OrchestrationTiming:
    """Median seconds of the direct calls and of the flow, and the overhead per configuration."""
    from towerbench.flows.sweep import sweep
    from towerbench.model.training import train

    data = _training_data(work_dir, settings)
    config = TrainConfig(
        dataset=DATASET, towers=1, global_batch=128, epochs=settings.orchestration_epochs
    )
    seeds = list(range(settings.orchestration_configurations))
    configs = [config.model_copy(update={"seed": seed}) for seed in seeds]
    grid = _one_config_per_seed(config, seeds)
    tracking = TrackingConfig(tracking_uri=os.environ["MLFLOW_TRACKING_URI"])
    report = ReportConfig(report_dir=work_dir / "reports")

    last_flow: dict[str, Any] = {}

    def flow_run() -> None:
        started = time.time()
        outcome = sweep(train=config, sweep=grid, tracking=tracking, report=report, data=data)
        last_flow.update(started=started, ended=time.time(), parent=outcome.parent_run_id)
        for run in outcome.configs:
            if run.status != Status.COMPLETED:
                raise TowerbenchError(
                    f"bench: the flow's training run {run.status}: "
                    f"{run.error or 'no error message'}"
                )

    def direct_runs() -> None:
        for each in configs:
            train(each, data.data_dir)

    start_fork_server()
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
    return OrchestrationTiming(
        breakdown=flow_breakdown(tracking, last_flow),
        process_start_seconds=timings["process_start"].median,
        train_examples=settings.orchestration_train_examples,
        epochs=settings.orchestration_epochs,
        configurations=len(configs),
        direct_seconds=direct,
        flow_seconds=flow_seconds,
        overhead_seconds=(flow_seconds - direct) / len(configs),
        direct_repeats=list(timings["direct"].seconds),
        flow_repeats=list(timings["flow"].seconds),
    )
