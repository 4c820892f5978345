"""towerbench from Python: `import towerbench` and its functions on a notebook's function and
arrays, run in a plain python process as a user's script would."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import fixtures_user
import numpy as np
import pytest

import towerbench
from towerbench.api.notebook_model import MODEL, function_file
from towerbench.config.model_ref import provenance

BUILD = """
import keras
from keras import layers

def build(input_shape, num_classes):
    inputs = keras.Input(input_shape)
    x = layers.Flatten()(inputs)
    x = layers.Dense(HIDDEN, activation="relu")(x)
    return keras.Model(inputs, layers.Dense(num_classes)(x))
"""


def define_build(hidden: int):
    namespace: dict = {"HIDDEN": hidden, "__name__": "__main__"}
    exec(compile(BUILD, "<notebook cell>", "exec"), namespace)  # noqa: S102 - a cell's function
    return namespace["build"]


def test_a_function_is_a_model_file_named_by_its_content(tmp_path):
    first = function_file(define_build(16), tmp_path, MODEL)
    assert first == function_file(define_build(16), tmp_path, MODEL)  # the same cell: the same file
    edited = function_file(define_build(32), tmp_path, MODEL)
    assert edited != first
    assert provenance(edited)["model_digest"] != provenance(first)["model_digest"]
    path, _, function = first.rpartition(":")
    assert function == "build" and Path(path).parent == tmp_path.resolve() / "models"


def test_a_function_of_another_signature_is_refused_in_one_line(tmp_path):
    with pytest.raises(towerbench.TowerbenchError, match=r"^model=: '<lambda>' takes \(shape\)"):
        towerbench.train(model=lambda shape: shape, data="digits", data_dir=tmp_path)


@pytest.mark.parametrize(
    ("keywords", "message"),
    [
        ({"epochs": -1}, r"^epochs=: "),
        ({"no_such_field": 1}, r"^no_such_field=: no such setting"),
        ({"optimizer": "adagrad"}, r"^optimizer=: "),
    ],
)
def test_bad_keywords_are_refused_with_the_cli_message(tmp_path, keywords, message):
    with pytest.raises(towerbench.TowerbenchError, match=message):
        towerbench.train(data="digits", data_dir=tmp_path, **keywords)


def test_a_function_carrying_megabytes_of_data_is_refused_with_a_hint(tmp_path):
    weights = np.zeros((3, 2**20), np.float32)  # 12 MB the function closes over

    def build(input_shape, num_classes):
        return weights.shape, input_shape, num_classes

    with pytest.raises(towerbench.TowerbenchError) as refused:
        function_file(build, tmp_path, MODEL)
    message = str(refused.value)
    assert message.startswith("model=: 'build' carries 12 MB by value") and "\n" not in message
    assert "load that inside build(input_shape, num_classes) instead" in message
    assert list(tmp_path.iterdir()) == []


def test_a_function_is_refused_on_a_pool(tmp_path):
    with pytest.raises(towerbench.TowerbenchError, match="^model=: a function defined here"):
        towerbench.sweep(model=define_build(8), data="digits", data_dir=tmp_path, pool="gpus")
    assert list(tmp_path.iterdir()) == []  # no model file written for a refused call


def test_a_call_refused_for_its_keywords_writes_no_model_file_and_no_arrays(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # arrays go through DVC's stages in a DVC project: not this one
    rng = np.random.default_rng(0)
    arrays = ((rng.normal(size=(40, 4)).astype(np.float32), rng.integers(0, 2, 40)),) * 2
    with pytest.raises(towerbench.TowerbenchError, match=r"^epochs=: "):
        towerbench.train(model=define_build(8), data=arrays, data_dir=tmp_path, epochs=-1)
    assert list(tmp_path.iterdir()) == []


SCRIPT = """
import json, sys
import numpy as np
import keras
from keras import layers
import towerbench

def build(input_shape, num_classes):
    inputs = keras.Input(input_shape)
    x = layers.Dense(16, activation="relu")(inputs)
    return keras.Model(inputs, layers.Dense(num_classes)(x))

rng = np.random.default_rng(0)
centres = rng.normal(size=(3, 12)).astype(np.float32)
labels = rng.integers(0, 3, size=300)
features = (centres[labels] + 0.5 * rng.normal(size=(300, 12))).astype(np.float32)
data = ((features[:240], labels[:240]), (features[240:], labels[240:]))
common = dict(model=build, data=data, name="blobs", tracking_uri="sqlite:///mlflow.db",
              epochs=1, global_batch=32, optimizer="adam")

one = towerbench.train(**common)
swept = towerbench.sweep(towers=[1, 2], seeds=[0], **common)
advice = towerbench.advise(towers=2, verify=False, probe_steps=20, **common)
import psutil
print(json.dumps({
    "children": [child.name() for child in psutil.Process().children(recursive=True)],
    "train": one.model_dump(mode="json"),
    "sweep": swept.model_dump(mode="json"),
    "rows": len(swept.to_frame()),
    "advise_run": advice.advise_run_id,
    "recipe": advice.params_file,
}))
"""


@pytest.mark.slow
def test_train_sweep_and_advise_from_a_python_script(tmp_path):
    done = fixtures_user.run_script(tmp_path, SCRIPT, timeout=900)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["train"]["status"] == "completed"
    assert 0 <= result["train"]["test_accuracy"] <= 1 and result["train"]["updates"] == -(
        -240 // 32
    )  # the last batch partial
    names = [config["name"] for config in result["sweep"]["configs"]]
    assert len(names) == 2 == result["rows"] and any("towers=2" in name for name in names)
    assert Path(result["sweep"]["report"]).is_file()
    assert Path(result["recipe"]).is_file()
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    run_ids = [result["train"]["run_id"], result["advise_run"]]
    run_ids += [config["run_id"] for config in result["sweep"]["configs"]]
    for run_id in run_ids:
        assert client.get_run(run_id).info.status == "FINISHED"
    assert (tmp_path / "data" / "raw" / "blobs" / "blobs.npz").is_file()
    assert "Traceback" not in done.stderr
    assert result["children"] == []  # nothing the calls started outlives them


INTERRUPTED = """
import sys
import numpy as np
import keras
import towerbench

def build(input_shape, num_classes):
    inputs = keras.Input(input_shape)
    return keras.Model(inputs, keras.layers.Dense(num_classes)(keras.layers.Dense(64)(inputs)))

rng = np.random.default_rng(0)
labels = rng.integers(0, 3, size=3000)
features = (labels[:, None] + rng.normal(size=(3000, 12))).astype(np.float32)
data = ((features[:2400], labels[:2400]), (features[2400:], labels[2400:]))
result = towerbench.sweep(model=build, data=data, name="blobs", towers=[2], seeds=[0],
                          epochs=int(sys.argv[1]), global_batch=32,
                          tracking_uri="sqlite:///mlflow.db", verbose=True)
print("PARENT", result.parent_run_id, result.configs[0].status)
"""


@pytest.mark.slow
def test_an_interrupted_call_marks_its_runs_killed_and_the_same_call_resumes(tmp_path):
    """The kernel's stop button is a SIGINT: the call raises KeyboardInterrupt, its runs are
    KILLED with their checkpoints kept, and the same call again continues them."""
    import signal

    import mlflow

    (tmp_path / "script.py").write_text(INTERRUPTED)
    # 20 epochs of about 0.5 s: training goes on ~10 s after epoch 1's line.
    command = [sys.executable, "script.py", "20"]
    with fixtures_user.interruptible_children():
        process = subprocess.Popen(
            command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
    seen = []
    for line in process.stdout:  # the first epoch's log line (verbose): training is under way
        seen.append(line)
        if "epoch 1:" in line:
            break
    process.send_signal(signal.SIGINT)
    rest, _ = process.communicate(timeout=120)
    assert process.returncode != 0 and "KeyboardInterrupt" in rest, "".join(seen) + rest
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (experiment,) = [e for e in client.search_experiments() if e.name != "Default"]
    runs = client.search_runs([experiment.experiment_id])
    assert {run.info.status for run in runs} == {"KILLED"}
    assert list((tmp_path / "data" / "checkpoints").glob("*/*"))  # kept for the resume
    again = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    parent = again.stdout.split("PARENT ")[1].split()[0]
    assert parent in {run.info.run_id for run in runs}  # the same sweep, resumed
    after = client.search_runs([experiment.experiment_id])
    assert {run.info.run_id for run in after} == {run.info.run_id for run in runs}  # reopened
    assert {run.info.status for run in after} == {"FINISHED"}


@pytest.mark.slow
def test_gradcheck_of_a_notebook_function(tmp_path):
    result = towerbench.gradcheck(
        model=define_build(8), towers=2, global_batch=8, data_dir=tmp_path
    )
    assert result.towers == 2 and result.global_batch == 8
    assert result.passed, result.explanation
    with pytest.raises(towerbench.TowerbenchError, match="unrecognized arguments: --epochs"):
        towerbench.gradcheck(model=define_build(8), towers=2, epochs=3, data_dir=tmp_path)
