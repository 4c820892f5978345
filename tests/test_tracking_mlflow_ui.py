"""What the MLflow UI shows of towerbench: experiments open on their training runs, per-epoch
metrics at the epoch (a real training process, real MLflow in SQLite), and no telemetry unless
asked for (checked against the installed MLflow and Prefect)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import fixtures_model
import pytest
from mlflow.tracking import MlflowClient

from towerbench.config.params import TrackingConfig
from towerbench.config.sections import TrainConfig
from towerbench.config.tracking_uri import resolve_tracking
from towerbench.serve.telemetry import OPT_IN
from towerbench.tasks.report.reading import run_record
from towerbench.tasks.tracking import (
    EXPERIMENT_KIND_TAG,
    create_config_run,
    ensure_experiment,
    run_url,
    runs_url,
    sweep_charts_url,
)
from towerbench.tasks.training.train import run_training_process
from towerbench.tasks.training.worker import WorkerRequest

pytestmark = pytest.mark.slow  # trains, or starts servers or processes

ROOT = Path(__file__).resolve().parents[1]


def tracking_in(folder: Path) -> TrackingConfig:
    return resolve_tracking(TrackingConfig(tracking_uri=f"sqlite:///{folder / 'mlflow.db'}"))


def test_towerbench_experiments_are_model_training_experiments(tmp_path) -> None:
    tracking = tracking_in(tmp_path)
    client = MlflowClient(tracking.tracking_uri)
    created = ensure_experiment(tracking, "towerbench-digits-tutorial")
    # Made before towerbench tagged its experiments: tagged when a sweep reuses it.
    older = client.create_experiment("towerbench-older")
    # Someone chose another kind in the UI: their choice stays.
    chosen = client.create_experiment("chosen", tags={EXPERIMENT_KIND_TAG: "genai_development"})
    assert ensure_experiment(tracking, "towerbench-older") == older
    assert ensure_experiment(tracking, "chosen") == chosen
    assert ensure_experiment(tracking, "towerbench-digits-tutorial") == created
    kinds = {
        experiment_id: client.get_experiment(experiment_id).tags.get(EXPERIMENT_KIND_TAG)
        for experiment_id in (created, older, chosen)
    }
    assert kinds == {
        created: "custom_model_development",
        older: "custom_model_development",
        chosen: "genai_development",
    }
    # MLflow 3.17's UI opens experiments by the browser's GenAI/training switch, not the tag:
    # our links set the switch.
    link = run_url(tracking, created, "abc")
    assert (
        link
        == f"http://127.0.0.1:5000/#/experiments/{created}/runs/abc?workflowType=machine_learning"
    )


def test_the_runs_link_opens_the_columns_a_sweep_compares(tmp_path) -> None:
    """MLflow 3.17 reads a "shared view" from an experiment tag when the link names its key:
    ours shows the sweep's axes and results, and a view someone saved under that key stays."""
    tracking = tracking_in(tmp_path)
    client = MlflowClient(tracking.tracking_uri)
    created = ensure_experiment(tracking, "towerbench-digits-tutorial")
    assert runs_url(tracking, created).endswith(
        f"/#/experiments/{created}/runs?workflowType=machine_learning&viewStateShareKey=towerbench"
    )
    view = json.loads(client.get_experiment(created).tags["mlflow.sharedViewState.towerbench"])
    columns = [column.split("`")[1] for column in view["selectedColumns"]]
    assert {"towers", "lr_scaling", "seed", "effective.metric", "test_metric"} <= set(columns)
    results = {"effective.metric", "test_metric", "images_per_sec"}
    assert set(columns) <= set(TrainConfig.model_fields) | results
    client.set_experiment_tag(created, "mlflow.sharedViewState.towerbench", "{}")  # re-saved
    ensure_experiment(tracking, "towerbench-digits-tutorial")
    assert client.get_experiment(created).tags["mlflow.sharedViewState.towerbench"] == "{}"


def test_the_charts_link_lists_the_sweeps_configuration_runs_by_name(tmp_path) -> None:
    """MLflow 3.17's UI nests child runs under their parent (its charts then plot and name the
    parent) unless the runs are filtered and sorted by other than their start: the charts link's
    filter and order, run as the UI runs them, give this sweep's configuration runs by name."""
    tracking = tracking_in(tmp_path)
    client = MlflowClient(tracking.tracking_uri)
    experiment_id = ensure_experiment(tracking, "towerbench-digits-tutorial")
    parents = [client.create_run(experiment_id).info.run_id for _ in range(2)]
    for parent, names in zip(parents, (["towers=4", "towers=1"], ["towers=2"]), strict=True):
        for name in names:
            client.create_run(experiment_id, run_name=name, tags={"mlflow.parentRunId": parent})
    link = urlsplit(sweep_charts_url(tracking, experiment_id, parents[0]))
    route, _, query = link.fragment.partition("?")
    assert route == f"/experiments/{experiment_id}/runs"
    asked = {key: values[-1] for key, values in parse_qs(query).items()}
    assert asked["compareRunsMode"] == "CHART" and asked["viewStateShareKey"] == "towerbench"
    order = f"{asked['orderByKey']} {'ASC' if asked['orderByAsc'] == 'true' else 'DESC'}"
    found = client.search_runs([experiment_id], asked["searchFilter"], order_by=[order])
    assert [run.info.run_name for run in found] == ["towers=1", "towers=4"]


def test_epoch_metrics_are_logged_at_their_epoch_whatever_the_tower_count(tmp_path) -> None:
    """2 towers (here 2 workers of 1 tower: a sweep's configuration as two processes, the chief
    logging) take half the optimizer steps of 1 per epoch; the MLflow step is the epoch, so the
    curves line up. 1.5 epochs: the last record ends half an epoch, at step 2."""
    data_dir = fixtures_model.write_digits(tmp_path / "data", train=192, test=40, shards=1)
    tracking = tracking_in(tmp_path)
    experiment_id = ensure_experiment(tracking, "steps")
    config = TrainConfig(
        dataset="digits", workers=2, global_batch=32, epochs=1.5, eval_every_epochs=0.5
    )
    parent = MlflowClient(tracking.tracking_uri).create_run(experiment_id).info.run_id
    run_id = create_config_run(tracking, experiment_id, parent, config, "2 towers", "g", "v1")
    request = WorkerRequest(
        config=config,
        data_dir=data_dir,
        tracking_uri=tracking.tracking_uri,
        run_id=run_id,
        data_version="v1",
    )
    result = run_training_process(request, on_event=lambda event: None)
    assert result.status == "completed", result

    client = MlflowClient(tracking.tracking_uri)
    history = {
        key: [(point.step, point.value) for point in client.get_metric_history(run_id, key)]
        for key in ("epoch", "step", "test_accuracy")
    }
    assert history["epoch"] == [(1, 1.0), (2, 1.5)]
    assert history["step"] == [(1, 6.0), (2, 9.0)]  # 192 / 32 optimizer steps per epoch
    # The per-epoch accuracies, then the final one at the last epoch's step: none elsewhere.
    assert [step for step, _ in history["test_accuracy"]] == [1, 2, 2]
    curve = run_record(client, client.get_run(run_id)).curve
    assert curve.epochs == [1.0, 1.5] and len(curve.scores) == len(curve.wall_times) == 2
    params = client.get_run(run_id).data.params
    assert (params["workers"], params["towers"], params["replicas"]) == ("2", "1", "2")
    assert len(params["cluster"].split(",")) == 2


def _telemetry_state(environment: dict[str, str]) -> dict[str, bool]:
    """Whether MLflow and Prefect would report usage in a process started like the CLI."""
    code = (
        "from towerbench.serve.telemetry import telemetry_off_unless_opted_in\n"
        "telemetry_off_unless_opted_in()\n"
        "import json\n"
        "from mlflow.telemetry.utils import is_telemetry_disabled\n"
        "from prefect._internal.analytics.enabled import is_telemetry_enabled\n"
        "print(json.dumps({'mlflow': not is_telemetry_disabled(), "
        "'prefect': is_telemetry_enabled()}))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        env=environment,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return json.loads(result.stdout.splitlines()[-1])


def test_telemetry_is_off_unless_the_user_opts_in(tmp_path) -> None:
    # As a user's shell would be: not under pytest or CI, which both tools already exclude.
    keep = ("PATH", "PYTHONPATH", "LANG", "MLFLOW_TRACKING_URI")
    environment = {key: os.environ[key] for key in keep if key in os.environ}
    environment["HOME"] = str(tmp_path)  # MLflow keeps an installation id there
    assert _telemetry_state(environment) == {"mlflow": False, "prefect": False}
    assert _telemetry_state({**environment, OPT_IN: "on"}) == {"mlflow": True, "prefect": True}
