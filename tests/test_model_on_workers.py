"""A user's model file on a pool's workers (issue 27): each worker takes the file in its own
checkout and refuses, in one line, one whose content is not the file the sweep planned with."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from towerbench.config.model_ref import model_in_checkout
from towerbench.core.errors import TowerbenchError

SOURCE = "def build(input_shape, num_classes):\n    raise NotImplementedError\n"


def _checkout(root: Path, source: str) -> Path:
    (root / "nets").mkdir(parents=True)
    (root / "nets" / "tiny.py").write_text(source)
    return root


def test_the_same_file_is_taken_in_the_workers_checkout(tmp_path) -> None:
    worker = _checkout(tmp_path / "worker", SOURCE)
    digest = hashlib.sha256(SOURCE.encode()).hexdigest()
    local = model_in_checkout("nets/tiny.py:build", worker, digest)
    assert local == f"{worker / 'nets' / 'tiny.py'}:build"
    assert model_in_checkout("tutorial", worker, None) == "tutorial"


def test_a_file_that_differs_from_the_sweeps_is_refused_in_one_line(tmp_path) -> None:
    worker = _checkout(tmp_path / "worker", SOURCE + "# edited on this host\n")
    digest = hashlib.sha256(SOURCE.encode()).hexdigest()
    with pytest.raises(TowerbenchError) as refused:
        model_in_checkout("nets/tiny.py:build", worker, digest)
    message = str(refused.value)
    assert "\n" not in message
    assert f"model file {worker / 'nets' / 'tiny.py'} differs from the sweep's" in message
    assert f"{digest[:12]} in the sweep" in message


def test_a_missing_file_is_refused_in_one_line(tmp_path) -> None:
    with pytest.raises(TowerbenchError, match="nets/tiny.py is missing in this worker's checkout"):
        model_in_checkout("nets/tiny.py:build", tmp_path, "0" * 64)


def test_a_loss_file_goes_to_the_workers_relative_with_its_digest_and_is_checked(
    tmp_path, monkeypatch
) -> None:
    from towerbench.config.losses import parse_loss
    from towerbench.config.model_ref import function_in_checkout
    from towerbench.config.sections import TrainConfig
    from towerbench.flows.sweep import for_workers
    from towerbench.tasks.training.worker import WorkerRequest

    project = _checkout(tmp_path / "project", SOURCE)
    monkeypatch.chdir(project)
    config = TrainConfig(loss=f"{project / 'nets' / 'tiny.py'}:build")
    request = WorkerRequest(
        config=config, data_dir=project / "data", tracking_uri="x", run_id="r", data_version="v"
    )
    sent = for_workers(request, project / "data")
    assert sent.config.loss == "nets/tiny.py:build"
    assert sent.loss_digest == hashlib.sha256(SOURCE.encode()).hexdigest()

    worker = _checkout(tmp_path / "worker", SOURCE)
    taken = function_in_checkout(parse_loss(sent.config.loss), worker, sent.loss_digest, "loss")
    assert taken == f"{worker / 'nets' / 'tiny.py'}:build"
    stale = _checkout(tmp_path / "stale", SOURCE + "# older\n")
    with pytest.raises(TowerbenchError, match=r"^loss file .* differs from the sweep's"):
        function_in_checkout(parse_loss(sent.config.loss), stale, sent.loss_digest, "loss")
    assert function_in_checkout(parse_loss("mse"), worker, None, "loss") is None
