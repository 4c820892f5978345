"""towerbench from Python: `import towerbench` and its functions on a notebook's function and
arrays, run in a plain python process as a user's script would."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import towerbench
from towerbench.api.notebook_model import model_file
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
    first = model_file(define_build(16), tmp_path)
    assert first == model_file(define_build(16), tmp_path)  # the same cell: the same file
    edited = model_file(define_build(32), tmp_path)
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


def test_a_function_is_refused_on_a_pool(tmp_path):
    with pytest.raises(towerbench.TowerbenchError, match="^model=: a function defined here"):
        towerbench.sweep(model=define_build(8), data="digits", data_dir=tmp_path, pool="gpus")


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
print(json.dumps({
    "train": one.model_dump(mode="json"),
    "sweep": swept.model_dump(mode="json"),
    "rows": len(swept.to_frame()),
    "advise_run": advice.advise_run_id,
    "recipe": advice.params_file,
}))
"""


@pytest.mark.slow
def test_train_sweep_and_advise_from_a_python_script(tmp_path):
    (tmp_path / "script.py").write_text(SCRIPT)
    done = subprocess.run(
        [sys.executable, "script.py"], cwd=tmp_path, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr[-3000:]
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
