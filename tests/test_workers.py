"""Workers: `towerbench train --workers 2 --towers 2` is one training over two processes on
127.0.0.1 that fails in one line when a worker dies, resumes every worker from the chief's
checkpoint and ends with the weights of one process with 4 towers."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import fixtures_model
import numpy as np
import psutil
import pytest
import tensorflow as tf
from fixtures_user import user_environment

from towerbench.cli.main import main
from towerbench.core.errors import TowerbenchError
from towerbench.model.checkpoints import HISTORY_FILE
from towerbench.model.cluster import Cluster

ROOT = Path(__file__).resolve().parents[1]
EPOCHS = 3
# 200 examples, global batch 32: 6 full batches and one of 8 (4 per worker) per epoch.
PARAMS = f"""\
data: {{data_dir: data}}
train: {{dataset: digits, epochs: {EPOCHS}, global_batch: 32, reference_batch: 32}}
"""
# Float32 sums in another order (towers of 8 examples, then workers) drift by ~1e-7 per step.
WEIGHT_TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def params_file(tmp_path_factory) -> Path:
    project = tmp_path_factory.mktemp("project")
    return fixtures_model.write_digits_project(project, PARAMS, train=200, test=64)


def _train(params_file: Path, checkpoints: Path, *options: str, capfd) -> dict:
    argv = ["train", "--params", str(params_file), "--checkpoint-dir", str(checkpoints)]
    status = main([*argv, *options, "--json"])
    captured = capfd.readouterr()
    assert status == 0, captured.err[-3000:]
    document = json.loads(captured.out)
    document["stderr"] = captured.err
    return document


def _weights(checkpoints: Path) -> dict[str, np.ndarray]:
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(checkpoints)))
    return {
        name: reader.get_tensor(name)
        for name in reader.get_variable_to_shape_map()
        if name.startswith(("weights/", "ema/"))
    }


def _largest_relative_difference(a: dict, b: dict) -> float:
    assert a.keys() == b.keys() and a
    return max(
        float(np.max(np.abs(a[name] - b[name])) / max(np.max(np.abs(b[name])), 1e-12)) for name in b
    )


@pytest.fixture(scope="module")
def four_towers(params_file: Path, tmp_path_factory) -> dict[str, np.ndarray]:
    """The reference: one process, 4 towers (this test session's logical CPUs)."""
    checkpoints = tmp_path_factory.mktemp("four-towers")
    status = main(
        ["train", "--params", str(params_file), "--towers", "4"]
        + ["--checkpoint-dir", str(checkpoints)]
    )
    assert status == 0
    return _weights(checkpoints)


def _worker_processes(launcher: psutil.Process) -> dict[int, psutil.Process]:
    """The launcher's workers by their TF_CONFIG task index."""
    workers = {}
    for child in launcher.children():
        with_config = child.environ().get("TF_CONFIG")
        if with_config:
            workers[json.loads(with_config)["task"]["index"]] = child
    return workers


@pytest.mark.slow
def test_a_killed_worker_ends_the_run_and_the_resumed_workers_match_one_process_of_four(
    params_file: Path, four_towers: dict, tmp_path: Path, capfd
) -> None:
    """Worker 1 is SIGKILLed after the first epoch's checkpoint: the run ends in one line within
    seconds, nothing is left running; the same command resumes both workers from the chief's
    checkpoint and ends with the weights of one process with 4 towers (float tolerance)."""
    command = [sys.executable, "-m", "towerbench.cli.main", "train", "--params", str(params_file)]
    command += ["--workers", "2", "--towers", "2", "--checkpoint-dir", str(tmp_path)]
    # TensorFlow's log level left to towerbench, as a user leaves it.
    env = user_environment()
    launcher = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 240
        while not (tmp_path / HISTORY_FILE).exists():  # the first epoch's checkpoint
            assert launcher.poll() is None and time.monotonic() < deadline, "no checkpoint"
            time.sleep(0.2)
        workers = _worker_processes(psutil.Process(launcher.pid))
        assert sorted(workers) == [0, 1]
        workers[1].send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        _, stderr = launcher.communicate(timeout=60)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 1  # a lost worker: the run failed (2 is for bad input)
    assert time.monotonic() - killed_at < 30
    assert "worker 1: killed by signal 9 (the other workers were stopped)" in stderr
    assert "another worker stopped or became unreachable" in stderr, stderr[-3000:]
    assert not re.search(r"^[IWEF]\d{4} |absl::InitializeLog", stderr, re.M), stderr[-3000:]
    assert not any(worker.is_running() for worker in workers.values())

    document = _train(params_file, tmp_path, "--workers", "2", "--towers", "2", capfd=capfd)
    assert re.search(
        f"resuming from step (7|14) \\(epoch (1|2)\\) of {tmp_path}\n", document["stderr"]
    )
    assert document["replicas"] == 4 and document["per_tower_batch"] == 8
    assert len(document["cluster"]) == 2 and document["cluster"][0].startswith("127.0.0.1:")
    assert document["steps"] == EPOCHS * 7 and document["config"]["workers"] == 2
    assert _largest_relative_difference(_weights(tmp_path), four_towers) < WEIGHT_TOLERANCE


@pytest.mark.slow
def test_workers_whose_launcher_is_killed_end_without_a_traceback(
    params_file: Path, tmp_path: Path
) -> None:
    """SIGKILL to `train --workers 2`: the chief, whose epoch lines the launcher was reading,
    finds its stdout a broken pipe; it and the other worker end quietly within seconds."""
    command = [sys.executable, "-m", "towerbench.cli.main", "train", "--params", str(params_file)]
    command += ["--workers", "2", "--epochs", "100", "--checkpoint-dir", str(tmp_path / "ck")]
    log = tmp_path / "stderr.txt"
    with open(log, "w") as stderr:
        launcher = subprocess.Popen(
            command, cwd=ROOT, stdout=subprocess.PIPE, stderr=stderr, text=True
        )
    try:
        for line in launcher.stdout:
            if line.startswith("epoch"):  # the chief is writing its epochs to the launcher
                break
        workers = _worker_processes(psutil.Process(launcher.pid))
        assert sorted(workers) == [0, 1]
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
        _, alive = psutil.wait_procs(list(workers.values()), timeout=30)
    finally:
        launcher.kill()
        launcher.wait()
    assert not alive
    assert "Traceback" not in log.read_text(), log.read_text()[-3000:]


@pytest.mark.slow
def test_gradcheck_across_workers_matches_one_device(params_file: Path, capfd) -> None:
    status = main(
        ["gradcheck", "--workers", "2", "--towers", "2", "--global-batch", "16", "--json"]
    )
    captured = capfd.readouterr()
    assert status == 0, captured.err[-3000:]
    document = json.loads(captured.out)
    assert document["workers"] == 2 and document["towers"] == 2
    assert document["workers_vs_single"]["max_rel_diff"] < 1e-5
    assert document["mirrored_vs_single"]["max_rel_diff"] < 1e-5


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("{not json", "expected"),
        ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 3}}', "index 3"),
        ('{"cluster": {"ps": ["a:1"]}, "task": {"type": "ps", "index": 0}}', "expected"),
    ],
)
def test_a_bad_tf_config_is_named(text: str, problem: str, monkeypatch) -> None:
    monkeypatch.setenv("TF_CONFIG", text)
    with pytest.raises(TowerbenchError, match=f"TF_CONFIG: .*{problem}"):
        Cluster.from_environment()
