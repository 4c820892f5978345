"""A dataset is never replaced under its reader, nor fetched twice at once (issue 64): the
command that finds its dataset held the other way is refused in one line, exit 2, and the files
the holder uses stay as they are. The holder is another process, as a real fetch, preprocess
or training would be."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fixtures_user import user_environment

pytestmark = pytest.mark.slow  # runs the command line (preprocess and train load TensorFlow)

HOLD = """
import sys
from pathlib import Path
from towerbench.core import dataset_lock
from towerbench.ingest.layout import raw_dir, staging_dir
data_dir, name, how = sys.argv[1:]
staging = staging_dir(raw_dir(Path(data_dir), name))
staging.mkdir(parents=True, exist_ok=True)
held = {
    "fetching": lambda: dataset_lock.fetch_staging_held(staging, name),
    "preprocessing": lambda: dataset_lock.dataset_written(data_dir, name),
    "reading": lambda: dataset_lock.datasets_read(data_dir, [name]),
}[how]
with held():
    print("held", flush=True)
    sys.stdin.read()  # until the test closes it
"""


@contextlib.contextmanager
def _held(data_dir: Path, name: str, how: str) -> Iterator[None]:
    """Dataset `name` held by another process while the block runs, as a fetch, a preprocess or
    a training (`how`: fetching, preprocessing, reading) holds it."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(data_dir), name, how],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        yield
    finally:
        holder.communicate(timeout=30)


def _towerbench(*argv: str, cwd: Path) -> tuple[int, list[str]]:
    """The command as a user runs it, TensorFlow's log level left to towerbench."""
    done = subprocess.run(
        [sys.executable, "-m", "towerbench.cli.main", *argv],
        cwd=cwd,
        env=user_environment(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    return done.returncode, done.stderr.strip().splitlines()


def test_a_second_fetch_of_a_name_being_fetched_is_refused_in_one_line(tmp_path) -> None:
    with _held(tmp_path / "data", "mn", "fetching"):
        status, errors = _towerbench("fetch", "digits", "--name", "mn", cwd=tmp_path)
    assert status == 2 and len(errors) == 1, errors
    assert errors[0] == (
        "towerbench fetch: error: dataset 'mn' is being fetched by another command: wait for "
        "that to end, then run this again"
    )
    assert not (tmp_path / "data" / "raw" / "mn").exists()


def test_a_dataset_being_read_is_not_preprocessed_under_its_reader(tmp_path) -> None:
    assert _towerbench("fetch", "digits", cwd=tmp_path)[0] == 0
    assert _towerbench("preprocess", "digits", cwd=tmp_path)[0] == 0
    shards = sorted((tmp_path / "data" / "tfrecords" / "digits").rglob("*"))
    before = {path: path.stat().st_mtime_ns for path in shards}
    with _held(tmp_path / "data", "digits", "reading"):
        status, errors = _towerbench("preprocess", "digits", cwd=tmp_path)
        assert status == 2 and len(errors) == 1, errors
        assert "dataset 'digits' in " in errors[0] and "is being read by a training" in errors[0]
    assert {path: path.stat().st_mtime_ns for path in shards} == before
    with _held(tmp_path / "data", "digits", "preprocessing"):  # no training meanwhile
        status, errors = _towerbench("train", "--dataset", "digits", "--epochs", "1", cwd=tmp_path)
    assert status == 2 and len(errors) == 1, errors
    assert "dataset 'digits' is being preprocessed by another command" in errors[0]
