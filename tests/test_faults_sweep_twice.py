"""The same sweep started twice (issues 29, 40): the second start refuses in one line naming the
live process, within 2 s (before Prefect's temporary server starts), and once that process is
gone (killed, even) the sweep can be started again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from towerbench.core.errors import TowerbenchError
from towerbench.tasks.sweep_lock import only_live_sweep

ROOT = Path(__file__).resolve().parents[1]
REFUSED_WITHIN_SECONDS = 2

HOLD_THE_LOCK = """
import sys, time
from pathlib import Path
from towerbench.tasks.sweep_lock import only_live_sweep
with only_live_sweep(Path(sys.argv[1]), sys.argv[2]):
    print("holding", flush=True)
    time.sleep(600)
"""


@pytest.mark.slow
def test_a_live_holder_is_named_and_a_killed_one_leaves_nothing_held(tmp_path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_THE_LOCK, str(tmp_path), "k" * 64],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "holding"
        with pytest.raises(TowerbenchError, match=f"already running \\(process {holder.pid} on"):
            with only_live_sweep(tmp_path, "k" * 64):
                pass
        with only_live_sweep(tmp_path, "another key"):  # other sweeps are not held up
            pass
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with only_live_sweep(tmp_path, "k" * 64):  # the kernel released the dead holder's lock
        pass


def _sweep_command(data_dir: Path) -> list[str]:
    return [
        sys.executable, "-m", "towerbench.cli.main", "sweep", "--dataset", "digits",
        "--towers", "1", "--seeds", "0", "--epochs", "500", "--data-dir", str(data_dir),
        "--report-dir", str(data_dir.parent / "reports"),
        "--tracking-uri", f"sqlite:///{data_dir.parent / 'mlflow.db'}",
    ]  # fmt: skip


@pytest.mark.slow
def test_the_same_sweep_started_twice_refuses_the_second(tmp_path) -> None:
    data_dir = tmp_path / "data"
    environment = {**os.environ, "PYTHONUNBUFFERED": "1"}
    for step in ("fetch", "preprocess"):
        command = [sys.executable, "-m", "towerbench.cli.main", step, "digits"]
        subprocess.run(
            [*command, "--data-dir", str(data_dir)],
            cwd=ROOT, env=environment, check=True, capture_output=True, timeout=300,
        )  # fmt: skip
    first = subprocess.Popen(
        _sweep_command(data_dir), cwd=ROOT, env=environment, stderr=subprocess.PIPE, text=True
    )
    try:
        for line in first.stderr:  # the first holds the lock once it trains
            if "epoch 1:" in line:
                break
        # The command's own start on this machine, as loaded now: refused at its options.
        started = time.monotonic()
        subprocess.run(
            [*_sweep_command(data_dir), "--towers", "0"], cwd=ROOT, env=environment,
            capture_output=True, timeout=300,
        )  # fmt: skip
        start_up = time.monotonic() - started
        started = time.monotonic()
        second = subprocess.run(
            _sweep_command(data_dir), cwd=ROOT, env=environment, capture_output=True, text=True,
            timeout=300,
        )  # fmt: skip
        seconds = time.monotonic() - started - start_up
        assert second.returncode == 2, second.stderr[-3000:]
        # Refused before Prefect's temporary server starts: its one line alone, at once.
        (error,) = second.stderr.strip().splitlines()
        assert error.startswith("towerbench sweep: error: "), error
        assert f"the same sweep is already running (process {first.pid} on" in error, error
        assert seconds < REFUSED_WITHIN_SECONDS, f"refused {seconds:.1f} s after its start-up"
        assert first.poll() is None  # the live sweep goes on
    finally:
        first.send_signal(signal.SIGINT)
        first.wait(timeout=120)


# A holder caught between taking the lock and writing who it is (two starts at once).
HOLD_AND_SAY_WHO_LATE = """
import fcntl, json, os, socket, sys, time
with open(sys.argv[1], "a+") as handle:
    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    handle.seek(0)
    handle.truncate()
    print("locked", flush=True)
    time.sleep(0.5)
    handle.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": 1e9}))
    handle.flush()
    time.sleep(600)
"""


@pytest.mark.slow
def test_two_starts_at_once_name_the_holder_not_a_question_mark(tmp_path) -> None:
    from towerbench.tasks.sweep_lock import lock_path

    path = lock_path(tmp_path.resolve(), "k" * 64)
    path.parent.mkdir(parents=True)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_AND_SAY_WHO_LATE, str(path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(TowerbenchError) as refused:
            with only_live_sweep(tmp_path, "k" * 64):
                pass
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(1e9))
    assert f"(process {holder.pid} on " in str(refused.value), refused.value
    assert f", started {started})" in str(refused.value) and "?" not in str(refused.value)
