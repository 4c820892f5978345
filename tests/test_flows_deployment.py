"""`towerbench serve` against a real local Prefect server, triggered as the UI's Run button does."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml
from fixtures_servers import free_port, untraced, wait_until
from mlflow.tracking import MlflowClient

from towerbench.config.load import load
from towerbench.config.sections import TrainConfig
from towerbench.core.errors import TowerbenchError
from towerbench.serve.deployments import SERVED_DEPLOYMENTS

pytestmark = pytest.mark.slow  # trains, or starts servers or processes

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def write_project(folder: Path) -> dict:
    """A DVC project (no git) building the embedded digits, with a one-run sweep."""
    folder.mkdir(parents=True)
    shutil.copy(ROOT / "dvc.yaml", folder / "dvc.yaml")
    params = {
        "fetch": {"source": "digits", "name": "digits"},
        "preprocess": {"shards": 1},
        "data": {"data_dir": "data"},
        # The digits preset turns off crop, flip and colour distortions.
        "train": {
            "dataset": "digits",
            "epochs": 1,
            "reference_batch": 32,
            "base_lr": 0.05,
            "decay": "constant",
        },
        "sweep": {"towers": [2], "seeds": [0], "warmup_epochs": [0], "per_tower_batch": 32},
        "tracking": {"tracking_uri": f"sqlite:///{folder / 'mlflow.db'}"},
        "nightly": {"cron": "30 2 * * *", "timezone": "Europe/Berlin"},
    }
    (folder / "params.yaml").write_text(yaml.safe_dump(params))
    subprocess.run([sys.executable, "-m", "dvc", "init", "--no-scm", "-q"], cwd=folder, check=True)
    return params


PIPELINE, NIGHTLY, ADVISE = SERVED_DEPLOYMENTS


def _registered(client, name: str) -> bool:
    from prefect.exceptions import ObjectNotFound

    try:
        client.read_deployment_by_name(name)
    except ObjectNotFound:
        return False
    return True


@pytest.fixture(scope="module")
def served_project(tmp_path_factory):
    """`towerbench serve` of a small project against a local Prefect server, once served."""
    tmp_path = tmp_path_factory.mktemp("served")
    project = tmp_path / "project"
    write_project(project)
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    environment = dict(
        os.environ,
        PREFECT_HOME=str(tmp_path / "prefect-home"),
        PREFECT_API_URL=api,
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
    )
    logs = tmp_path / "logs"
    logs.mkdir()
    server = subprocess.Popen(
        [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        env=untraced(environment),
        stdout=(logs / "server.log").open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    processes = [server]
    try:
        wait_until(
            lambda: httpx.get(f"{api}/health", timeout=2).status_code == 200,
            180,
            "the Prefect server",
            processes,
        )
        serve = subprocess.Popen(
            [str(BIN / "towerbench"), "serve", "--params", str(project / "params.yaml")],
            env=environment,
            cwd=tmp_path,  # not the project: the served runs must not depend on it
            stdout=(logs / "serve.log").open("w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        processes.append(serve)
        from prefect.client.orchestration import get_client
        from prefect.settings import PREFECT_API_URL, temporary_settings

        with temporary_settings({PREFECT_API_URL: api}), get_client(sync_client=True) as client:
            wait_until(  # all of them: serve registers one at a time (CI once read advise too soon)
                lambda: all(_registered(client, name) for name in SERVED_DEPLOYMENTS),
                120,
                "the served deployments",
                processes,
            )
        yield project, api, processes, logs
    finally:
        for process in reversed(processes):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGINT)
        for process in processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)


def test_the_run_form_asks_each_setting_once(served_project) -> None:
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    project, api, processes, logs = served_project
    with temporary_settings({PREFECT_API_URL: api}), get_client(sync_client=True) as client:
        deployment = client.read_deployment_by_name(PIPELINE)
    schema = deployment.parameter_openapi_schema
    assert list(schema["properties"]) == [
        "dataset",
        "sweep",
        "epochs",
        "model",
        "loss",
        "optimizer",
        "advanced",
        "params_file",
        "fresh",
    ]
    model = schema["properties"]["model"]  # a text field, with the reference's forms as help
    assert {"type": "string"} in model["anyOf"] and "file.py:function" in model["description"]
    optimizer = schema["properties"]["optimizer"]  # a choice of the eight, or the file's
    assert "lamb" in str(optimizer) and deployment.parameters["optimizer"] == "momentum"
    names = [
        field for group in schema["definitions"].values() for field in group.get("properties", {})
    ] + list(schema["properties"])
    assert len(names) == len(set(names)) == 19, names  # 3 dataset + 7 sweep + 9 fields
    assert all("<" not in str(group) for group in schema["definitions"].values())
    assert deployment.parameters["params_file"] == str(project / "params.yaml")
    assert deployment.parameters["sweep"]["towers"] == [2]  # params.yaml's values


def test_the_advise_form_is_short_and_bounded(served_project) -> None:
    """The advise deployment asks for the towers and little else; its bounds are the CLI's."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    project, api, processes, logs = served_project
    with temporary_settings({PREFECT_API_URL: api}), get_client(sync_client=True) as client:
        deployment = client.read_deployment_by_name(ADVISE)
    schema = deployment.parameter_openapi_schema
    assert list(schema["properties"]) == [
        "advice",
        "model",
        "loss",
        "optimizer",
        "dataset",
        "params_file",
        "advanced",
        "fresh",
    ]
    advice = schema["definitions"]["AdviseConfig"]["properties"]
    assert list(advice) == ["towers", "workers", "seeds", "verify", "probe_steps"]
    assert (advice["towers"]["minimum"], advice["seeds"]["default"]) == (2, 3)
    assert deployment.parameters == {
        "advice": {"towers": 4},
        "optimizer": "momentum",  # the params file's, shown as the form's choice
        "params_file": str(project / "params.yaml"),
    }


def test_the_form_schema_has_the_configs_bounds_and_the_server_enforces_them(
    served_project,
) -> None:
    """The served deployment's parameter schema bounds each number as TrainConfig does (what
    the CLI enforces); Prefect refuses a run outside them before it starts."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import PrefectHTTPStatusError
    from prefect.settings import PREFECT_API_URL, temporary_settings

    project, api, processes, logs = served_project
    train = TrainConfig.model_json_schema()["properties"]
    bounds = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")

    def bounds_of(schema: dict) -> dict:
        return {key: schema[key] for key in bounds if key in schema}

    with temporary_settings({PREFECT_API_URL: api}), get_client(sync_client=True) as client:
        deployment = client.read_deployment_by_name(PIPELINE)
        schema = deployment.parameter_openapi_schema
        sweep = schema["definitions"]["SweepChoice"]["properties"]
        assert bounds_of(schema["properties"]["epochs"]) == bounds_of(train["epochs"]) != {}
        for field, config_field in (
            ("towers", "towers"),
            ("seeds", "seed"),
            ("warmup_epochs", "warmup_epochs"),
        ):
            assert bounds_of(sweep[field]["items"]) == bounds_of(train[config_field]) != {}
        for wrong in ({"epochs": -1}, {"sweep": {**deployment.parameters["sweep"], "towers": [0]}}):
            with pytest.raises(PrefectHTTPStatusError, match="409"):
                client.create_flow_run_from_deployment(
                    deployment.id, parameters={**deployment.parameters, **wrong}
                )


SMALL_MODEL = """
import keras

def build(input_shape, num_classes):
    inputs = keras.Input(shape=input_shape)
    x = keras.layers.Flatten()(inputs)
    x = keras.layers.BatchNormalization()(keras.layers.Dense(16, activation="relu")(x))
    return keras.Model(inputs, keras.layers.Dense(num_classes)(x))
"""


def test_a_dataset_other_than_params_yaml_is_built_by_dvc_and_trained(served_project) -> None:
    """The form's dataset is not params.yaml's: DVC builds it beside the file (which stays as it
    was), the run trains the user's model the form names, and MLflow records that dataset's DVC
    hash."""
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL, temporary_settings

    project, api, processes, logs = served_project
    params_before = (project / "params.yaml").read_bytes()
    with temporary_settings({PREFECT_API_URL: api}):
        with get_client(sync_client=True) as client:
            nightly = client.read_deployment_by_name(NIGHTLY)
            (schedule,) = [item.schedule for item in nightly.schedules]
            assert (schedule.cron, schedule.timezone) == ("30 2 * * *", "Europe/Berlin")
            assert not nightly.paused
            form = client.read_deployment_by_name(PIPELINE).parameters
        form["dataset"]["name"] = "digits-copy"
        form["advanced"] = {"train.crop_size": None}  # the digits preset goes by the name
        (project / "nets").mkdir(exist_ok=True)  # the user's model, in the form's text field
        (project / "nets" / "net.py").write_text(SMALL_MODEL)
        form["model"] = "nets/net.py:build"
        flow_run = run_deployment(PIPELINE, parameters=form, timeout=420, poll_interval=0.5)
    serve_log = (logs / "serve.log").read_text()[-3000:]
    assert flow_run.state is not None and flow_run.state.is_completed(), serve_log
    assert (project / "params.yaml").read_bytes() == params_before

    client = MlflowClient(f"sqlite:///{project / 'mlflow.db'}")
    (experiment,) = [e for e in client.search_experiments() if e.name != "Default"]
    parents = client.search_runs(
        [experiment.experiment_id], filter_string="tags.`towerbench.kind` = 'sweep'"
    )
    assert len(parents) == 1 and parents[0].data.tags["towerbench.flow"] == "pipeline"
    children = client.search_runs(
        [experiment.experiment_id], filter_string="tags.`towerbench.kind` = 'config'"
    )
    assert [run.data.params["towers"] for run in children] == ["2"]
    assert {run.data.params["dataset"] for run in children} == {"digits-copy"}
    assert {run.data.params["model_function"] for run in children} == {"build"}
    digest = hashlib.sha256(SMALL_MODEL.encode()).hexdigest()
    assert {run.data.params["model_digest"] for run in children} == {digest}
    assert {run.data.tags["towerbench.status"] for run in children} == {"completed"}
    # The data version is DVC's content hash of that dataset's TFRecords folder.
    lock = yaml.safe_load((project / "datasets" / "digits-copy" / "dvc.lock").read_text())
    dvc_hash = lock["stages"]["preprocess"]["outs"][0]["md5"]
    assert {run.data.params["data_version"] for run in children} == {dvc_hash}


def test_serve_without_a_server_says_schedules_need_one(tmp_path) -> None:
    environment = {key: value for key, value in os.environ.items() if key != "PREFECT_API_URL"}
    environment["PREFECT_HOME"] = str(tmp_path / "prefect-home")
    (tmp_path / "params.yaml").write_text("train:\n  dataset: digits\n")
    result = subprocess.run(
        [str(BIN / "towerbench"), "serve", "--params", str(tmp_path / "params.yaml")],
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "schedules need a Prefect server" in result.stderr
    assert "ephemeral" in result.stderr


def test_other_settings_under_params_yamls_dataset_name_fail_at_once(served_project) -> None:
    """They would overwrite params.yaml's data: no retries, one line naming the field."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL, temporary_settings

    project, api, processes, logs = served_project
    with temporary_settings({PREFECT_API_URL: api}), get_client(sync_client=True) as client:
        form = client.read_deployment_by_name(PIPELINE).parameters
        # Typed in the form: params.yaml's name (an empty name would follow the source).
        form["dataset"].update(source="cifar10", name="digits")
        started = time.monotonic()
        flow_run = run_deployment(PIPELINE, parameters=form, timeout=180, poll_interval=0.5)
        waited = time.monotonic() - started
        (fetch,) = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run.id]))
        )
    assert flow_run.state is not None and flow_run.state.is_failed(), flow_run.state
    message = flow_run.state.message or ""
    assert "fetch.source: 'cifar10' in the form, 'digits' in params.yaml" in message
    assert "\n" not in message
    assert fetch.run_count == 1  # no retries: they wait 10 s, then 60 s
    # Once its process has started, the run fails within seconds; starting the process (imports
    # of TensorFlow and MLflow) is most of `waited` on a busy machine.
    assert (flow_run.end_time - flow_run.start_time).total_seconds() < 15, waited


def test_the_schedule_time_zone_must_be_an_iana_name(tmp_path) -> None:
    path = tmp_path / "params.yaml"
    path.write_text("nightly:\n  timezone: Mars/Olympus_Mons\n")
    with pytest.raises(TowerbenchError, match=r"params.yaml: nightly.timezone: .*not an IANA"):
        load(path)
    path.write_text("nightly:\n  timezone: America/New_York\n")
    assert load(path).nightly.timezone == "America/New_York"


def test_an_unfetched_dataset_fails_in_one_line_before_anything_trains(served_project) -> None:
    """The form's training dataset is one that was never fetched: Failed at once, one line that
    names the field, and no run in MLflow claiming data it did not train on."""
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL, temporary_settings

    project, api, processes, logs = served_project
    store = MlflowClient(f"sqlite:///{project / 'mlflow.db'}")
    runs_before = len(store.search_runs([e.experiment_id for e in store.search_experiments()]))
    with temporary_settings({PREFECT_API_URL: api}), get_client(sync_client=True) as client:
        form = client.read_deployment_by_name(PIPELINE).parameters
        form["advanced"] = {"train.dataset": "cifar10"}
        flow_run = run_deployment(PIPELINE, parameters=form, timeout=180, poll_interval=0.5)
    assert flow_run.state is not None and flow_run.state.is_failed(), flow_run.state
    message = flow_run.state.message or ""
    assert "train.dataset: 'cifar10' is not the dataset that fetch builds ('digits')" in message
    assert "\n" not in message
    assert (flow_run.end_time - flow_run.start_time).total_seconds() < 30
    runs_after = len(store.search_runs([e.experiment_id for e in store.search_experiments()]))
    assert runs_after == runs_before
