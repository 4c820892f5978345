"""A full disk in fetch and preprocess (issue 10): one line naming the path and the space needed,
exit 2, nothing partial left behind, and the previous good version of the output untouched.

The disk is a real tmpfs of a few hundred KiB (the kernel itself answers ENOSPC, to Python's
writes and to TensorFlow's file writer alike); mounting it needs root, as on CI. One test
injects ENOSPC at the very last write of a fetch instead, through our own record writer.
"""

from __future__ import annotations

import errno
import hashlib
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from fixtures_data import http_server, make_cifar10_archive
from PIL import Image

from towerbench import ingest
from towerbench.cli.main import main
from towerbench.core.files import format_bytes
from towerbench.core.tfrecord_format import dataset_dir, load_manifest


@pytest.fixture
def small_disk(tmp_path) -> Iterator[Callable[[int], Path]]:
    """`small_disk(kib)`: a fresh folder on a tmpfs of that size, unmounted after the test."""
    mounted: list[Path] = []

    def mount(kib: int) -> Path:
        folder = tmp_path / f"disk{len(mounted)}"
        folder.mkdir()
        result = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={kib}k", "tmpfs", str(folder)],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            pytest.skip(f"cannot mount a small tmpfs here (needs root): {result.stderr.strip()}")
        mounted.append(folder)
        return folder

    yield mount
    for folder in mounted:
        subprocess.run(["umount", "--lazy", str(folder)], check=False)


def _md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def _fails(capsys, argv: list[str], *expected: str) -> str:
    """Run the CLI, expect exit 2 and one line of error containing each of `expected`."""
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"towerbench {argv[0]}: error: ")
    for text in expected:
        assert text in lines[0]
    return lines[0]


def _files(folder: Path) -> dict[str, bytes]:
    return {
        str(path.relative_to(folder)): path.read_bytes()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


@pytest.fixture(scope="module")
def archives(tmp_path_factory) -> dict[str, Path]:
    """A small CIFAR-10 archive (~37 KiB) and a large one (~370 KiB): random pixels, so gzip
    cannot shrink them."""
    folder = tmp_path_factory.mktemp("archives")
    small, large = folder / "small.tar.gz", folder / "large.tar.gz"
    make_cifar10_archive(small, per_file=2, test=2)
    make_cifar10_archive(large, per_file=20, test=20)
    return {"small": small, "large": large}


def _fetch(url: str, archive: Path, data: Path) -> list[str]:
    return ["fetch", "cifar10", "--url", url, "--md5", _md5(archive), "--data-dir", str(data)]


def test_download_onto_a_full_disk_is_one_line_and_leaves_nothing(small_disk, capsys, archives):
    data = small_disk(256) / "data"
    payload = archives["large"].read_bytes()
    with http_server({"/c.tar.gz": payload}) as (url, _):
        _fails(
            capsys,
            _fetch(f"{url}/c.tar.gz", archives["large"], data),
            "cifar-10-binary.tar.gz.part",
            "no space left on device",
            f"needs {format_bytes(len(payload))}",  # the size the server announced
        )
    assert not (data / "raw").exists()  # no .part, no staging folder, no empty raw/<name>/


def test_copy_onto_a_full_disk_is_one_line_and_leaves_nothing(small_disk, capsys, archives):
    data = small_disk(256) / "data"
    archive = archives["large"]
    _fails(
        capsys,
        _fetch(str(archive), archive, data),
        "no space left on device",
        f"needs {format_bytes(archive.stat().st_size)}",
    )
    assert not (data / "raw").exists()


def test_failed_refetch_keeps_the_good_dataset(small_disk, capsys, archives):
    data = small_disk(256) / "data"
    assert main(_fetch(str(archives["small"]), archives["small"], data)) == 0
    good = data / "raw" / "cifar10"
    before = _files(good)
    with http_server({"/c.tar.gz": archives["large"].read_bytes()}) as (url, _):
        _fails(capsys, _fetch(f"{url}/c.tar.gz", archives["large"], data), "no space left")
    assert _files(good) == before
    assert [path.name for path in (data / "raw").iterdir()] == ["cifar10"]
    assert main(["preprocess", "cifar10", "--data-dir", str(data)]) == 0
    assert load_manifest(dataset_dir(data, "cifar10")).splits["train"].examples == 10


def test_refetch_failing_at_its_last_write_keeps_the_good_dataset(
    tmp_path, capsys, archives, monkeypatch
):
    data = tmp_path / "data"
    assert main(_fetch(str(archives["small"]), archives["small"], data)) == 0
    good = data / "raw" / "cifar10"
    before = _files(good)

    def disk_full(folder: Path, record: dict) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(folder / "source.json"))

    # Our own record writer, the last write before the new version is swapped in.
    monkeypatch.setattr(ingest, "write_source_record", disk_full)
    _fails(capsys, _fetch(str(archives["large"]), archives["large"], data), str(good), "no space")
    assert _files(good) == before  # the old source.json included: still a usable dataset
    assert [path.name for path in (data / "raw").iterdir()] == ["cifar10"]


def test_preprocess_onto_a_full_disk_keeps_the_previous_tfrecords(small_disk, capsys, archives):
    # Room for the archive (~75 KiB) and one set of TFRecords (~75 KiB), not for a second set
    # beside it, which is where a new version is written before it replaces the old one.
    data = small_disk(200) / "data"
    archive = data.parent / "c.tar.gz"
    make_cifar10_archive(archive, per_file=4, test=4)
    assert main(_fetch(str(archive), archive, data)) == 0
    archive.unlink()
    assert main(["preprocess", "cifar10", "--data-dir", str(data)]) == 0
    published = dataset_dir(data, "cifar10")
    before = _files(published)
    _fails(
        capsys,
        ["preprocess", "cifar10", "--data-dir", str(data), "--shards", "2"],
        str(published),
        "no space left on device for the TFRecords",
        f"needs {format_bytes(24 * 32 * 32 * 3)}",
    )
    assert _files(published) == before
    assert [path.name for path in published.parent.iterdir()] == ["cifar10"]  # no staging left


def test_image_folder_copy_onto_a_full_disk_stops_at_once_and_leaves_nothing(
    small_disk, capsys, tmp_path
):
    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        for name in ("cat", "dog"):
            folder = tmp_path / "pets" / split / name
            folder.mkdir(parents=True)
            for index in range(2):  # noise does not compress: ~48 KiB each, ~390 KiB in all
                pixels = rng.integers(0, 256, (128, 128, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(folder / f"{index}.png")
    needed = sum(path.stat().st_size for path in (tmp_path / "pets").rglob("*.png"))
    data = small_disk(256) / "data"
    argv = ["fetch", "imagefolder", "--url", str(tmp_path / "pets"), "--data-dir", str(data)]
    _fails(capsys, argv, "no space left on device for the copied images", format_bytes(needed))
    assert not (data / "raw").exists()
