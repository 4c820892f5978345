"""Faults of issue 29 caught at the door: names the tool derives or is given (one rule, one
message), links and special files in an image folder, a folder without a test split, a
truncated image, invalid YAML, a dataset that cannot serve the run or whose shard is damaged
(before TensorFlow loads), and a tracking URI where another kind of web server answers."""

from __future__ import annotations

import http.server
import io
import os
import threading
import zipfile
from pathlib import Path

import fixtures_model
import numpy as np
import pytest
from fixtures_data import make_image_folder
from PIL import Image
from test_cli_startup import probe

from towerbench.cli.main import main
from towerbench.config.names import NAME_RULE
from towerbench.config.sections import TrainConfig
from towerbench.core.errors import TowerbenchError
from towerbench.core.tfrecord_format import dataset_dir, load_manifest
from towerbench.tasks.preflight import check_servers


def _fails(capsys, argv: list[str], *expected: str) -> str:
    """Run the CLI in this process: exit 2 and one line of error containing each of `expected`
    (after TensorFlow's start-up lines, if the command loaded it)."""
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    lines = lines[-1:] if argv[0] == "preprocess" and "absl" in lines[0] else lines
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"towerbench {argv[0]}: error: "), lines
    for text in expected:
        assert text in lines[0], lines[0]
    return lines[0]


def _zip_folder(folder: Path, archive: Path) -> Path:
    with zipfile.ZipFile(archive, "w") as zipped:
        for path in sorted(folder.rglob("*")):
            zipped.write(path, path.relative_to(folder).as_posix())
    return archive


# Names


def test_fetch_stores_a_zip_with_spaces_under_a_valid_name_train_accepts(tmp_path, capsys):
    make_image_folder(tmp_path / "folder")
    archive = _zip_folder(tmp_path / "folder", tmp_path / "my photos (1).zip")
    data = tmp_path / "data"
    assert main(["fetch", "imagefolder", "--url", str(archive), "--data-dir", str(data)]) == 0
    assert "as 'my-photos-1'" in capsys.readouterr().out
    assert (data / "raw" / "my-photos-1" / "source.json").is_file()
    assert TrainConfig(dataset="my-photos-1").dataset == "my-photos-1"  # what train will take


@pytest.mark.parametrize(
    ("argv", "where"),
    [
        (["fetch", "imagefolder", "--url", "x.zip", "--name", "my photos"], "--name: "),
        (["preprocess", "my photos"], "NAME: "),
        (["train", "--dataset", "my photos"], "--dataset: "),
        (["sweep", "--dataset", "tiny,my photos"], "--dataset[1]: "),  # the list item, named
    ],
)
def test_one_rule_and_one_message_wherever_a_name_is_taken(tmp_path, capsys, argv, where):
    argv = [*argv, "--data-dir", str(tmp_path / "data")]
    message = _fails(
        capsys, argv, f"{where}not a valid dataset name ({NAME_RULE}); try 'my-photos'"
    )
    assert "pattern" not in message


def test_a_300_character_name_is_refused_by_the_rule_not_as_an_unwritable_data_dir(
    tmp_path, capsys
):
    name = "a" * 300
    argv = ["fetch", "digits", "--name", name, "--data-dir", str(tmp_path / "data")]
    message = _fails(capsys, argv, f"--name: not a valid dataset name ({NAME_RULE})")
    assert "not writable" not in message
    assert not (tmp_path / "data").exists()
    # A folder name the file system cannot hold is said as such too.
    long_dir = tmp_path / ("d" * 300)
    argv = ["fetch", "digits", "--data-dir", str(long_dir)]
    _fails(capsys, argv, "path too long for the file system")


# Links and special files in an image folder


def _fetch_folder(folder: Path, data: Path) -> list[str]:
    return ["fetch", "imagefolder", "--url", str(folder), "--data-dir", str(data)]


def _nothing_published(data: Path) -> bool:
    """The data folder as it was before the failed fetch: not there (no raw dataset, no
    staging folder, no empty folder)."""
    return not data.exists()


@pytest.mark.parametrize("target", ["file", "folder"])
def test_a_link_out_of_the_image_folder_is_refused_and_nothing_is_copied(tmp_path, capsys, target):
    make_image_folder(tmp_path / "pets")
    outside = tmp_path / "secret"
    outside.mkdir()
    Image.fromarray(np.zeros((16, 16, 3), np.uint8)).save(outside / "private.png")
    link = tmp_path / "pets" / "train" / "cat" / "link.png"
    link.symlink_to(outside / "private.png" if target == "file" else outside)
    data = tmp_path / "data"
    _fails(capsys, _fetch_folder(tmp_path / "pets", data), str(link), "outside", "refused")
    assert _nothing_published(data)


def test_a_fifo_in_the_image_folder_is_refused_without_waiting_on_it(tmp_path, capsys):
    make_image_folder(tmp_path / "pets")
    fifo = tmp_path / "pets" / "test" / "dog" / "pipe.png"
    os.mkfifo(fifo)
    data = tmp_path / "data"
    _fails(capsys, _fetch_folder(tmp_path / "pets", data), str(fifo), "a FIFO: refused")
    assert _nothing_published(data)


def test_a_link_to_an_image_inside_the_folder_is_copied_as_that_image(tmp_path):
    make_image_folder(tmp_path / "pets")
    original = tmp_path / "pets" / "train" / "cat" / "0.jpg"
    (tmp_path / "pets" / "train" / "cat" / "again.jpg").symlink_to(original)
    data = tmp_path / "data"
    assert main(_fetch_folder(tmp_path / "pets", data)) == 0
    copy = data / "raw" / "pets" / "images" / "train" / "cat" / "again.jpg"
    assert not copy.is_symlink() and copy.read_bytes() == original.read_bytes()


# Splits and damaged images


def test_a_train_only_folder_is_refused_at_fetch(tmp_path, capsys):
    make_image_folder(tmp_path / "pets")
    for path in sorted((tmp_path / "pets" / "test").rglob("*"), reverse=True):
        path.rmdir() if path.is_dir() else path.unlink()
    (tmp_path / "pets" / "test").rmdir()
    data = tmp_path / "data"
    _fails(capsys, _fetch_folder(tmp_path / "pets", data), "no test split (found: train)")
    assert _nothing_published(data)


@pytest.mark.parametrize("kept_bytes", [30, 300])  # cut in its header; cut in its pixels
def test_a_truncated_png_is_called_truncated(tmp_path, capsys, kept_bytes):
    make_image_folder(tmp_path / "pets")
    image = tmp_path / "pets" / "test" / "dog" / "0.png"  # the folder's grayscale PNG
    buffer = io.BytesIO()
    pixels = np.random.default_rng(0).integers(0, 256, (20, 24), dtype=np.uint8)
    Image.fromarray(pixels).save(buffer, "PNG")  # 568 bytes
    image.write_bytes(buffer.getvalue()[:kept_bytes])
    data = tmp_path / "data"
    assert main(_fetch_folder(tmp_path / "pets", data)) == 0
    capsys.readouterr()
    _fails(
        capsys, ["preprocess", "pets", "--data-dir", str(data)], "0.png: truncated or damaged PNG"
    )
    assert not (data / "tfrecords").exists()  # no empty folder where there was none


# The params file


def test_invalid_yaml_is_named_by_file_line_and_column(tmp_path, capsys):
    params = tmp_path / "params.yaml"
    params.write_text("train:\n  epochs: 3\n  model: tutorial: bn\n")
    _fails(capsys, ["train", "--params", str(params)], f"{params}:3:18: not valid YAML: mapping")


# Before TensorFlow loads


@pytest.fixture(scope="module")
def digits_dir(tmp_path_factory) -> Path:
    return fixtures_model.write_digits(tmp_path_factory.mktemp("data"), train=240, test=80)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["train", "--dataset", "absent"], "--dataset absent: no preprocessed data"),
        (["train", "--crop-size", "12"], "--crop-size 12 is larger than the 8x8 images"),
        (["sweep", "--dataset", "digits,absent"], "--dataset absent: no preprocessed data"),
        (["sweep", "--crop-size", "12"], "--crop-size 12 is larger than the 8x8 images"),
    ],
)
@pytest.mark.slow
def test_data_that_cannot_serve_the_run_is_one_line_before_tensorflow(
    tmp_path, digits_dir, argv, message
):
    outcome, completed = probe(tmp_path, *argv, "--data-dir", str(digits_dir))
    assert outcome == {"status": 2, "heavy": []}, completed.stderr[-2000:]
    assert completed.stderr.count("\n") == 1 and message in completed.stderr


@pytest.mark.slow
def test_a_damaged_shard_is_named_before_tensorflow_loads(tmp_path):
    data = fixtures_model.write_digits(tmp_path / "data", train=240, test=80)
    folder = dataset_dir(data, "digits")
    shard = folder / load_manifest(folder).splits["test"].files[1].path
    damaged = bytearray(shard.read_bytes())
    damaged[len(damaged) // 2] ^= 0x01
    shard.write_bytes(bytes(damaged))
    outcome, completed = probe(tmp_path, "train", "--data-dir", str(data))
    assert outcome == {"status": 2, "heavy": []}, completed.stderr[-2000:]
    assert completed.stderr == (
        f"towerbench train: error: {shard}: TFRecord shard is damaged: its sha256 is not the one "
        "manifest.json lists; rebuild the dataset (`towerbench preprocess digits`, or `dvc "
        "repro` in a DVC project)\n"
    )


# A tracking URI where something else answers


class _AnyPathHandler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        body = b"<html><body>It works!</body></html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_a_web_server_that_is_not_mlflow_is_refused_in_one_line():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _AnyPathHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}"
    try:
        with pytest.raises(TowerbenchError) as refused:
            check_servers(url, prefect=False)
    finally:
        server.shutdown()
        server.server_close()
    message = str(refused.value)
    assert message.startswith(f"tracking URI {url}: a web server answers, but not MLflow's")
    assert "HTTP 200, text/html" in message and "\n" not in message


@pytest.mark.slow
def test_report_on_a_store_that_does_not_exist_creates_none(tmp_path):
    store = tmp_path / "nowhere" / "mlflow.db"
    outcome, completed = probe(
        tmp_path, "report", "--sweep", "0" * 32, "--tracking-uri", f"sqlite:///{store}"
    )
    assert outcome == {"status": 2, "heavy": []}
    assert completed.stderr == (
        f"towerbench report: error: tracking URI sqlite:///{store}: no MLflow store there (the "
        "file does not exist); give the store the sweep was tracked in (--tracking-uri, or "
        "tracking.tracking_uri in the params file)\n"
    )
    assert not store.parent.exists()
