"""The Prefect run form's values: a dataset name that follows the source, bounds as the CLI's."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from towerbench.config.load import load
from towerbench.config.run_form import (
    DatasetChoice,
    SweepChoice,
    form_overrides,
    form_parameters,
    loss_override,
    model_override,
)
from towerbench.config.sections import dataset_name
from towerbench.core.errors import TowerbenchError
from towerbench.tasks.data.dvc_stages import FORM_DATASETS, data_stages

ROOT = Path(__file__).resolve().parents[1]


def project(folder: Path, fetch: dict) -> Path:
    """params.yaml (with this `fetch:`) and dvc.yaml: what the served form starts from."""
    folder.mkdir()
    shutil.copy(ROOT / "dvc.yaml", folder / "dvc.yaml")
    params = {"fetch": fetch, "data": {"data_dir": "data"}, "train": {"dataset": fetch["name"]}}
    (folder / "params.yaml").write_text(yaml.safe_dump(params))
    return folder / "params.yaml"


def submit(params_path: Path, **dataset: object):
    """The form's defaults with `dataset` changed, as the pipeline flow loads them."""
    in_file = load(params_path, resolve_tracking=False)
    defaults = form_parameters(in_file, params_path)
    chosen = DatasetChoice(**{**defaults["dataset"], **dataset})
    sweep = SweepChoice(**defaults["sweep"])
    overrides = form_overrides(chosen, sweep, defaults["epochs"], {}, in_file.fetch)
    return load(params_path, overrides, resolve_tracking=False)


def test_the_dataset_name_follows_the_source_unless_typed(tmp_path) -> None:
    params_path = project(tmp_path / "p", {"source": "digits", "name": "digits"})
    defaults = form_parameters(load(params_path, resolve_tracking=False), params_path)
    assert defaults["dataset"]["name"] is None  # not pre-filled with "digits"

    unchanged = submit(params_path)
    assert dataset_name(unchanged.fetch) == unchanged.train.dataset == "digits"
    stages = data_stages(
        params_path.parent, unchanged.fetch, unchanged.preprocess, unchanged.data.data_dir
    )
    assert stages.folder == params_path.parent  # params.yaml's own stages, no copy

    other = submit(params_path, source="cifar10")  # only the source changed
    assert dataset_name(other.fetch) == other.train.dataset == "cifar10"
    stages = data_stages(params_path.parent, other.fetch, other.preprocess, other.data.data_dir)
    assert stages.folder == params_path.parent / FORM_DATASETS / "cifar10"

    typed = submit(params_path, source="cifar10", name="digits")  # a name typed in the form
    with pytest.raises(TowerbenchError, match="give it another name"):
        data_stages(params_path.parent, typed.fetch, typed.preprocess, typed.data.data_dir)


def test_a_name_of_its_own_in_params_yaml_stays_in_the_form(tmp_path) -> None:
    params_path = project(tmp_path / "p", {"source": "digits", "name": "my-digits"})
    defaults = form_parameters(load(params_path, resolve_tracking=False), params_path)
    assert defaults["dataset"]["name"] == "my-digits"


@pytest.mark.parametrize(
    ("section", "values", "where"),
    [
        (SweepChoice, {"towers": [2, 0]}, "towers.1"),
        (SweepChoice, {"seeds": [-1]}, "seeds.0"),
        (SweepChoice, {"warmup_epochs": [-0.5]}, "warmup_epochs.0"),
        (DatasetChoice, {"name": "../x"}, "name"),
    ],
)
def test_form_sections_refuse_what_the_config_refuses(section, values, where) -> None:
    with pytest.raises(ValidationError) as raised:
        section(**values)
    assert [".".join(map(str, error["loc"])) for error in raised.value.errors()] == [where]


def test_the_forms_model_file_is_taken_beside_the_params_file(tmp_path, monkeypatch) -> None:
    params_path = project(tmp_path / "p", {"source": "digits", "name": "digits"})
    (params_path.parent / "nets").mkdir()
    (params_path.parent / "nets" / "net.py").write_text("def build(shape, classes): ...\n")
    monkeypatch.chdir(tmp_path)  # a served flow runs in another folder
    overrides = model_override(" nets/net.py:build ", params_path)
    chosen = load(params_path, overrides, resolve_tracking=False).train.model
    assert chosen == f"{params_path.parent / 'nets' / 'net.py'}:build"
    assert model_override("", params_path) == model_override(None, params_path) == []
    with pytest.raises(TowerbenchError, match=r"^model: nets/other.py: no such model file"):
        model_override("nets/other.py:build", params_path)
    with pytest.raises(TowerbenchError, match="^model: .*not a built-in network"):
        model_override("resnet50", params_path)


def test_the_forms_loss_file_is_taken_beside_the_params_file(tmp_path, monkeypatch) -> None:
    params_path = project(tmp_path / "p", {"source": "digits", "name": "digits"})
    (params_path.parent / "losses.py").write_text("def focal(y_true, y_pred): ...\n")
    monkeypatch.chdir(tmp_path)  # a served flow runs in another folder
    overrides = loss_override("losses.py:focal", params_path)
    chosen = load(params_path, overrides, resolve_tracking=False).train.loss
    assert chosen == f"{params_path.parent / 'losses.py'}:focal"
    assert (
        load(params_path, loss_override("mse", params_path), resolve_tracking=False).train.loss
        == "mse"
    )
    assert loss_override(" ", params_path) == loss_override(None, params_path) == []
    with pytest.raises(TowerbenchError, match=r"^loss: other.py: no such loss file"):
        loss_override("other.py:focal", params_path)
    with pytest.raises(TowerbenchError, match="^loss: 'hinge' is not a built-in loss"):
        loss_override("hinge", params_path)
