"""The sweep flow for real: Prefect test harness, MLflow in a temp SQLite store, real training
processes on a tiny dataset; then the report command on what the sweep left in MLflow."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import fixtures_model
import mlflow
import numpy as np
import pytest
from fixtures_servers import untraced_prefect_harness
from mlflow.tracking import MlflowClient
from prefect.settings import PREFECT_API_URL

from towerbench.cli.main import main
from towerbench.config.params import TrackingConfig
from towerbench.config.sections import TrainConfig
from towerbench.config.tracking_uri import resolve_tracking
from towerbench.core.tfrecord_format import dataset_dir

pytestmark = pytest.mark.slow  # trains, or starts servers or processes

ROOT = Path(__file__).resolve().parents[1]

TINY_TRAINING = {
    "dataset": "tiny",
    "epochs": 2,
    "reference_batch": 32,
    "base_lr": 0.05,
    "decay": "constant",
    "crop_size": None,
    "random_flip": False,
    "brightness_delta": 0,
    "contrast_lower": 1.0,
    "contrast_upper": 1.0,
}


def write_tiny_digits(data_dir: Path) -> None:
    """240 training and 80 test images of the real 8x8 digits, as dataset `tiny`."""
    fixtures_model.write_digits(data_dir, train=240, test=80, name="tiny")


DAMAGED_SHARD = "train-00000-of-00002.tfrecord"


def write_damaged_digits(data_dir: Path) -> None:
    """`tiny` again as dataset `damaged`, one byte of a record of DAMAGED_SHARD flipped before
    its digest was taken: the checks at the start pass, and training fails reading it."""
    fixtures_model.write_digits(data_dir, train=240, test=80, name="damaged")
    folder = dataset_dir(data_dir, "damaged")
    shard = folder / DAMAGED_SHARD
    damaged = bytearray(shard.read_bytes())
    damaged[len(damaged) // 2] ^= 0xFF
    shard.write_bytes(bytes(damaged))
    manifest = json.loads((folder / "manifest.json").read_text())
    for entry in manifest["splits"]["train"]["files"]:
        if entry["path"] == DAMAGED_SHARD:
            entry["sha256"] = hashlib.sha256(damaged).hexdigest()
    (folder / "manifest.json").write_text(json.dumps(manifest))


# Paths relative to the file's folder; the command runs from another folder.
PARAMS = """\
data: {data_dir: data}
tracking: {tracking_uri: "sqlite:///mlflow.db"}
report: {report_dir: reports}
"""


@pytest.fixture(scope="module")
def prefect_api_url():
    with untraced_prefect_harness():
        yield PREFECT_API_URL.value()


# `towerbench` (cli.main.run) saying, as it exits, whether its own process imported TensorFlow.
COMMAND_SAYING_ITS_IMPORTS = (
    "import atexit, sys; from towerbench.cli import main as cli; atexit.register(lambda: print("
    "'tensorflow imported:', 'tensorflow' in sys.modules, file=sys.stderr)); cli.run()"
)


@pytest.fixture(scope="module")
def finished_sweep(prefect_api_url, tmp_path_factory):
    """`towerbench sweep --params FILE --json` as a user runs it, in its own process, against
    the test's Prefect server (whose artifacts a test reads afterwards): towers 1 and 2 on the
    tiny set and on a copy with a shard damaged (those runs fail while training). Returns the
    JSON summary, the tracking settings, the folder and stderr."""
    root = tmp_path_factory.mktemp("sweep")
    write_tiny_digits(root / "data")
    write_damaged_digits(root / "data")
    (root / "params.yaml").write_text(PARAMS)
    training = [
        f"--{key.replace('_', '-')}={'none' if value is None else value}"
        for key, value in TINY_TRAINING.items()
        if key != "dataset"
    ]
    options = ["--dataset=damaged,tiny", "--towers=1,2", "--seeds=0", "--lr-scaling=linear"]
    options += ["--warmup-epochs=0", "--per-tower-batch=32", *training]
    completed = subprocess.run(
        [sys.executable, "-c", COMMAND_SAYING_ITS_IMPORTS, "sweep"]
        + ["--params", str(root / "params.yaml"), *options, "--json"],
        cwd=tmp_path_factory.mktemp("elsewhere"),
        env=dict(os.environ, PYTHONPATH=str(ROOT), PREFECT_API_URL=prefect_api_url),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    tracking = resolve_tracking(TrackingConfig(tracking_uri=f"sqlite:///{root / 'mlflow.db'}"))
    return json.loads(completed.stdout), tracking, root, completed.stderr


def test_json_is_the_whole_of_stdout_and_the_files_sections_are_used(finished_sweep) -> None:
    """Progress and logs (of Prefect, MLflow and the training processes) went to stderr; the
    file's tracking and report sections were used, relative to the file."""
    outcome, _, root, stderr = finished_sweep
    assert Path(outcome["report"]).is_relative_to(root / "reports")
    assert (root / "mlflow.db").is_file()
    assert f"MLflow parent run: {outcome['parent_run_id']}" in stderr
    assert stderr.count("Could not find cuda drivers") <= 1
    # The damaged dataset's runs failed mid-training: each says why in one line, no traceback.
    assert "Traceback" not in stderr, stderr[-3000:]


def test_the_results_are_said_once_on_the_terminal_and_kept_in_the_prefect_ui(
    finished_sweep,
) -> None:
    """The command prints its results and verdicts; the flow logs them for the UI only."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterTextSearch

    outcome, *_, stderr = finished_sweep
    parent_line = f"MLflow parent run: {outcome['parent_run_id']}"
    said = [parent_line, *(f"{group}: {verdict}" for group, verdict in outcome["verdicts"].items())]
    assert outcome["verdicts"] and all(stderr.count(line) == 1 for line in said), stderr[-3000:]
    with get_client(sync_client=True) as client:
        search = LogFilterTextSearch(query=f'"{outcome["parent_run_id"]}"')
        logs = client.read_logs(log_filter=LogFilter(text=search))
    assert parent_line in [log.message for log in logs]


def test_the_sweeps_own_process_leaves_tensorflow_to_the_training_processes(
    finished_sweep,
) -> None:
    """Importing it costs every command ~7 s of CPU that its training processes pay already."""
    *_, stderr = finished_sweep
    assert "tensorflow imported: False" in stderr, stderr[-3000:]


def test_sweep_records_parent_and_one_nested_run_per_configuration(finished_sweep) -> None:
    outcome, tracking, *_ = finished_sweep
    client = MlflowClient(tracking.tracking_uri)
    parent = client.get_run(outcome["parent_run_id"])
    assert parent.data.tags["towerbench.kind"] == "sweep"
    assert parent.info.status == "FINISHED"
    children = client.search_runs(
        [parent.info.experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'",
    )
    names = {run.info.run_name: run for run in children}
    assert sorted(names) == sorted(
        f"towers={towers} agg=mean lr={rule} warmup=0 dataset={dataset} seed=0"
        for towers, rule in ((1, "none"), (2, "linear"))
        for dataset in ("damaged", "tiny")
    )
    for run in children:
        assert run.data.tags["towerbench.kind"] == "config"
        assert set(TrainConfig.model_fields) <= set(run.data.params)

    # The damaged shard failed its runs in one line naming it; the sweep went on.
    for towers in (1, 2):
        failed = names[
            f"towers={towers} agg=mean lr={'none' if towers == 1 else 'linear'} "
            "warmup=0 dataset=damaged seed=0"
        ]
        assert failed.info.status == "FAILED"
        assert failed.data.tags["towerbench.status"] == "failed"
        error = failed.data.tags["towerbench.error"]
        assert f"{DAMAGED_SHARD}: TFRecord shard is damaged (corrupted record" in error
        assert "\n" not in error and "Traceback" not in error
    # The --json line: one entry per configuration, with the documented keys.
    assert set(outcome) == {"parent_run_id", "configs", "verdicts", "report"}
    statuses = sorted((c["towers"], c["seed"], c["status"]) for c in outcome["configs"])
    assert statuses == [
        (1, 0, "completed"),
        (1, 0, "failed"),
        (2, 0, "completed"),
        (2, 0, "failed"),
    ]
    for config in outcome["configs"]:
        assert set(config) == {
            *("run_id", "towers", "workers", "seed", "status", "test_accuracy", "worker"),
            *("metric", "test_metric"),  # as the run resolved train.metric, and its value
            *("epochs", "steps"),  # as trained
        }
        assert (config["steps"] is None) == (config["status"] == "failed")
        assert config["worker"] is None  # trained here, not by a pool's worker
        assert (config["test_accuracy"] is None) == (config["status"] == "failed")
        if config["status"] == "completed":
            assert config["metric"] == "accuracy"
            assert config["test_metric"] == config["test_accuracy"]


def _completed(finished_sweep):
    outcome, tracking, *_ = finished_sweep
    client = MlflowClient(tracking.tracking_uri)
    return client, [
        client.get_run(config["run_id"])
        for config in outcome["configs"]
        if config["status"] == "completed"
    ]


def test_completed_runs_carry_params_metrics_data_version_and_artifacts(finished_sweep) -> None:
    _, _, root, _ = finished_sweep
    client, runs = _completed(finished_sweep)
    for run in runs:
        params, metrics = run.data.params, run.data.metrics
        towers = int(params["towers"])
        assert int(params["global_batch"]) == 32 * towers
        assert float(params["effective_lr"]) == pytest.approx(0.05 * towers)
        assert params["device_kind"] in ("logical CPU", "logical GPU", "physical GPU")
        assert len(params["device_names"].split(",")) == towers
        # Without a DVC hash (plain `sweep`) the data version is the manifest's md5.
        manifest = dataset_dir(root / "data", "tiny") / "manifest.json"
        md5 = hashlib.md5(manifest.read_bytes()).hexdigest()
        assert params["tensorflow_version"] and params["data_version"] == f"manifest-md5:{md5}"
        assert [item.dataset.digest for item in run.inputs.dataset_inputs] == [md5]

        history = client.get_metric_history(run.info.run_id, "cross_entropy")
        assert len(history) == 2  # one point per epoch
        assert 0.0 <= metrics["test_accuracy"] <= 1.0
        assert metrics["images_per_sec"] > 0
        assert ("noise_scale" in metrics) == (towers >= 2)
        assert any(key.startswith("system/") for key in metrics)

        artifacts = {item.path for item in client.list_artifacts(run.info.run_id)}
        assert {"confusion_matrix.json", "learning_curves.png"} <= artifacts
        assert ("gradcheck.json" in artifacts) == (towers >= 2)


def accuracy_on_test_split(model, config: TrainConfig, data_dir: Path) -> float:
    """Accuracy of `model` on every test example once, with the trainer's evaluation input."""
    from towerbench.core.tfrecord_format import load_manifest, split_files
    from towerbench.model.input_pipeline import evaluation_dataset

    folder = dataset_dir(data_dir, config.dataset)
    manifest = load_manifest(folder)
    files = split_files(folder, manifest, "test")
    correct = total = 0
    for images, labels, mask in evaluation_dataset(
        files, manifest.image_shape, config.crop_size, batch=64
    ):
        predicted = np.argmax(model(images, training=False), axis=-1)  # (batch,)
        valid = mask.numpy()  # padding at the end of the last batch is not counted
        correct += int(np.sum(predicted[valid] == labels.numpy()[valid]))
        total += int(valid.sum())
    return correct / total


def test_logged_model_loads_and_reproduces_the_logged_accuracy(finished_sweep) -> None:
    import towerbench.model.networks  # noqa: F401 - registers the custom layers for loading

    _, tracking, root, _ = finished_sweep
    _, runs = _completed(finished_sweep)
    mlflow.set_tracking_uri(tracking.tracking_uri)  # `models:/<id>` resolves in this store
    for run in runs:
        loaded = mlflow.keras.load_model(run.data.tags["towerbench.model_uri"])
        config = TrainConfig.model_validate_json(run.data.tags["towerbench.config"])
        accuracy = accuracy_on_test_split(loaded, config, root / "data")
        assert accuracy == pytest.approx(run.data.metrics["test_accuracy"], abs=1e-6)


def test_report_file_mlflow_copy_and_report_command(finished_sweep) -> None:
    outcome, tracking, root, _ = finished_sweep
    report = Path(outcome["report"])
    text = report.read_text()
    assert "| towers=2 agg=mean lr=linear warmup=0 dataset=tiny |" in text
    assert "failed:" in text and "baseline" in text
    # The per-epoch table ends with each completed run's final test accuracy (one seed each).
    section = text.split("## Test accuracy per epoch")[1].split("## Figures")[0]
    table = [
        [cell.strip() for cell in line.strip("|").split("|")]
        for line in section.splitlines()
        if line.startswith("| ")
    ]
    for run in _completed(finished_sweep)[1]:
        column = table[0].index(run.data.tags["towerbench.group"])
        assert table[-1][column] == f"{100 * run.data.metrics['test_accuracy']:.2f}%"
    assert {path.name for path in report.parent.iterdir()} == {
        "report.md",
        "report.html",
        "verdicts.json",  # SweepResult.verdicts
        "accuracy_vs_epoch.png",
        "accuracy_vs_time.png",
        "loss_vs_epoch.png",
        "noise_scale_vs_epoch.png",  # the 2-tower runs measured it
    }
    assert "![loss_vs_epoch.png](loss_vs_epoch.png)" in text  # files beside the markdown
    html = (report.parent / "report.html").read_text()
    assert "<table>" in html and html.count('src="data:image/png;base64,') == 4
    verdicts = json.loads((report.parent / "verdicts.json").read_text())
    assert verdicts == outcome["verdicts"] and all(group in text for group in verdicts)
    client = MlflowClient(tracking.tracking_uri)
    logged = {item.path for item in client.list_artifacts(outcome["parent_run_id"], "report")}
    assert {"report/report.md", "report/report.html"} <= logged
    parent_metrics = client.get_run(outcome["parent_run_id"]).data.metrics
    assert "delta_pp/towers-2_agg-mean_lr-linear_warmup-0_dataset-tiny" in parent_metrics
    assert "## Losses" in text and "| train loss |" in text

    printed = io.StringIO()  # not capsys: Prefect's log handler would keep its stream past the test
    with contextlib.redirect_stdout(printed):
        status = main(
            [
                "report",
                "--sweep",
                outcome["parent_run_id"],
                "--tracking-uri",
                tracking.tracking_uri,
                "--report-dir",
                str(root / "again"),
                "--target-accuracy",
                "0.2",
            ]
        )
    report_again = Path(printed.getvalue().strip().splitlines()[-1])
    assert status == 0 and report_again.parent.parent == root / "again"
    assert "s to 20.0%" in report_again.read_text()


def test_prefect_artifacts_progress_and_report_linking_the_parent_run(finished_sweep) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    outcome, *_ = finished_sweep
    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["sweep-report"]))
        )
        progress = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["sweep-progress"]))
        )
    assert progress and all(artifact.data == 100 for artifact in progress)
    texts = [artifact.data for artifact in artifacts]
    # Figures embedded: the Prefect UI cannot load files beside the report.
    assert all("](accuracy_vs" not in text and "data:image/png;base64," in text for text in texts)
    assert any(
        "#/experiments/" in text
        and f"/runs/{outcome['parent_run_id']}" in text
        and "| configuration |" in text
        for text in texts
    )


def test_nightly_report_compares_with_the_previous_nightly(finished_sweep) -> None:
    """A later nightly sweep whose 2-tower run is 10 points worse than the finished one."""
    from towerbench.config.params import ReportConfig
    from towerbench.tasks.report import write_report

    outcome, tracking, root, _ = finished_sweep
    client = MlflowClient(tracking.tracking_uri)
    earlier = client.get_run(outcome["parent_run_id"])
    client.set_tag(earlier.info.run_id, "towerbench.flow", "nightly")
    later = client.create_run(
        earlier.info.experiment_id,
        run_name="nightly later",
        tags={"towerbench.kind": "sweep", "towerbench.flow": "nightly"},
    )
    client.log_param(later.info.run_id, "data_version", earlier.data.params["data_version"])
    (source,) = [
        client.get_run(config["run_id"])
        for config in outcome["configs"]
        if config["status"] == "completed" and config["towers"] == 2
    ]
    child = client.create_run(
        earlier.info.experiment_id,
        run_name=source.info.run_name,
        tags={
            key: value for key, value in source.data.tags.items() if key.startswith("towerbench.")
        }
        | {"mlflow.parentRunId": later.info.run_id},
    )
    accuracy = source.data.metrics["test_accuracy"] - 0.1
    for key, value in (("epoch", 2.0), ("wall_time", 5.0), ("test_accuracy", accuracy)):
        client.log_metric(child.info.run_id, key, value, step=1)
    client.set_terminated(child.info.run_id)
    client.set_terminated(later.info.run_id)

    report = write_report(tracking, later.info.run_id, ReportConfig(report_dir=root / "later"))
    section = report.read_text().split("## Compared with the previous nightly sweep")[1]
    assert f"run `{earlier.info.run_id}` (same data version)" in section
    assert "| towers=2 agg=mean lr=linear warmup=0 dataset=tiny |" in section
    assert "−10.00 pp" in section  # a true minus, as every difference


def test_a_sweep_whose_every_run_diverged_fails(prefect_api_url, tmp_path) -> None:
    """Base LR 100000 diverges at 1 and at 2 towers: the runs' lines and verdicts, then one
    error line and status 1; the flow run Failed with that line; every run FAILED in MLflow
    with why it diverged; the 1-tower advice names what changes at its batch."""
    write_tiny_digits(tmp_path / "data")
    (tmp_path / "params.yaml").write_text(PARAMS)
    training = {**TINY_TRAINING, "epochs": 1, "base_lr": 100000}
    options = [
        f"--{key.replace('_', '-')}={'none' if value is None else value}"
        for key, value in training.items()
    ]
    options += ["--towers=1,2", "--seeds=0", "--lr-scaling=linear", "--per-tower-batch=32"]
    completed = subprocess.run(
        [sys.executable, "-c", COMMAND_SAYING_ITS_IMPORTS, "sweep"]
        + ["--params", str(tmp_path / "params.yaml"), *options, "--json"],
        cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=str(ROOT), PREFECT_API_URL=prefect_api_url),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert completed.returncode == 1, completed.stderr[-3000:]
    outcome = json.loads(completed.stdout)  # what it recorded, as a completed sweep's, and why
    assert [config["status"] for config in outcome["configs"]] == ["diverged", "diverged"]
    assert outcome["status"] == 1 and outcome["error"].startswith("no configuration completed")
    said = [line for line in completed.stderr.splitlines() if line.startswith("towerbench ")]
    assert said[-1].startswith(
        "towerbench sweep: error: no configuration completed (2 diverged of 2 runs); towers=1 "
    ), said
    assert said[-1].endswith(f"report: {outcome['report']}")
    [one_tower] = [text for group, text in outcome["verdicts"].items() if "towers=1" in group]
    assert "lower the base LR (100000) (untested here); add warmup epochs" in one_tower
    assert "scaling" not in one_tower and "sqrt" not in one_tower

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert client.get_run(outcome["parent_run_id"]).info.status == "FAILED"
    for config in outcome["configs"]:
        run = client.get_run(config["run_id"])
        assert run.info.status == "FAILED" and run.data.tags["towerbench.status"] == "diverged"
        assert run.data.tags["towerbench.diverged"].startswith("training cross-entropy reached")

    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as prefect:
        failed = [run for run in prefect.read_flow_runs() if run.state and run.state.is_failed()]
    assert [run.flow_id for run in failed] and all(
        "no configuration completed (2 diverged of 2 runs)" in (run.state.message or "")
        for run in failed
    ), [(run.name, run.state.message) for run in failed]


def test_diverged_and_failed_configurations_are_counted_in_an_artifact(prefect_api_url) -> None:
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from towerbench.core.outcome import ConfigSummary, Status
    from towerbench.flows.sweep import note_unfinished

    def summary(name: str, status: Status) -> ConfigSummary:
        return ConfigSummary(status=status, run_id=name, name=name, towers=1, workers=1, seed=0)

    @flow
    def noting() -> None:
        note_unfinished(
            [
                summary("a", Status.COMPLETED),
                summary("b", Status.DIVERGED),
                summary("c", Status.FAILED),
            ]
        )

    noting()
    with get_client(sync_client=True) as prefect:
        artifacts = prefect.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["sweep-failures"]))
        )
    assert any(
        "**1 of 3 configurations failed.**\n\n- `c`: see its log" in artifact.data
        and "**1 of 3 configurations diverged.**\n\n- `b`: see its loss curve" in artifact.data
        for artifact in artifacts
    ), [artifact.data for artifact in artifacts]
