"""Fetch + preprocess through the real CLI: CIFAR archives over HTTP, image folders, digits,
and every bad input of issue 2 (one-line error naming the file, exit 2, nothing published)."""

from __future__ import annotations

import hashlib
import io
import shutil
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from fixtures_data import (
    CIFAR10_CLASSES,
    http_server,
    make_cifar10_archive,
    make_cifar100_archive,
    make_image_folder,
)

from towerbench.cli.main import main
from towerbench.core.tfrecord_format import dataset_dir, load_manifest, split_files
from towerbench.model.tfrecords import decode_example


def _md5(path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def _fails(capsys, argv: list[str], *expected: str) -> str:
    """Run the CLI, expect exit 2 and a one-line message containing `expected`."""
    assert main(argv) == 2
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert message.startswith(f"towerbench {argv[0]}: error: ")
    for text in expected:
        assert text in message
    return message


def _decoded(data_dir, name: str, split: str) -> tuple[np.ndarray, np.ndarray]:
    folder = dataset_dir(data_dir, name)
    manifest = load_manifest(folder)
    dataset = tf.data.TFRecordDataset(split_files(folder, manifest, split)).map(
        lambda record: decode_example(record, manifest.image_shape)
    )
    pairs = list(dataset.as_numpy_iterator())
    return np.stack([image for image, _ in pairs]), np.array([label for _, label in pairs])


def _sorted(images: np.ndarray, labels: np.ndarray) -> list[tuple[bytes, int]]:
    return sorted(
        (image.tobytes(), int(label)) for image, label in zip(images, labels, strict=True)
    )


@pytest.fixture(scope="module")
def cifar10_archive(tmp_path_factory):
    path = tmp_path_factory.mktemp("archive") / "cifar-10-binary.tar.gz"
    return path, make_cifar10_archive(path)


def _fetch_argv(source: str, url: str, md5: str, data: Path, *extra: str) -> list[str]:
    """`towerbench fetch` of an archive with its md5 into `data`."""
    return ["fetch", source, "--url", url, "--md5", md5, "--data-dir", str(data), *extra]


def test_cifar10_over_http_gives_the_archive_images_and_labels(tmp_path, cifar10_archive):
    archive, truth = cifar10_archive
    data = tmp_path / "data"
    with http_server({"/c.tar.gz": archive.read_bytes()}) as (url, _):
        assert main(_fetch_argv("cifar10", f"{url}/c.tar.gz", _md5(archive), data)) == 0
    assert main(["preprocess", "cifar10", "--data-dir", str(data), "--shards", "3"]) == 0
    manifest = load_manifest(dataset_dir(data, "cifar10"))
    assert manifest.classes == list(CIFAR10_CLASSES)
    assert manifest.image_shape == [32, 32, 3]
    assert manifest.source["md5"] == _md5(archive)
    assert manifest.splits["train"].examples == 100
    assert manifest.splits["train"].per_class == [10] * 10
    assert len(manifest.splits["train"].files) == 3
    for split in ("train", "test"):
        assert _sorted(*_decoded(data, "cifar10", split)) == _sorted(*truth[split])


def test_cifar100_keeps_fine_labels_by_default_and_coarse_on_request(tmp_path):
    archive = tmp_path / "cifar-100-binary.tar.gz"
    train_labels = make_cifar100_archive(archive)
    data = tmp_path / "data"
    assert main(_fetch_argv("cifar100", f"file://{archive}", _md5(archive), data)) == 0
    for label_set, column, count in (("fine", 1, 100), ("coarse", 0, 20)):
        assert (
            main(
                [
                    "preprocess",
                    "cifar100",
                    "--label-set",
                    label_set,
                    "--shards",
                    "1",
                    "--data-dir",
                    str(data),
                ]
            )
            == 0
        )
        manifest = load_manifest(dataset_dir(data, "cifar100"))
        assert len(manifest.classes) == count
        assert manifest.source["label_set"] == label_set
        _, labels = _decoded(data, "cifar100", "train")
        np.testing.assert_array_equal(labels, train_labels[:, column])  # one shard: file order


def test_wrong_md5_is_refused_and_nothing_published(tmp_path, capsys, cifar10_archive):
    archive, _ = cifar10_archive
    data = tmp_path / "data"
    _fails(
        capsys,
        ["fetch", "cifar10", "--url", str(archive), "--md5", "0" * 32, "--data-dir", str(data)],
        str(archive),
        "md5",
    )
    assert not (data / "raw").exists()  # nothing left, not even an empty folder
    _fails(capsys, ["preprocess", "cifar10", "--data-dir", str(data)], "fetch")
    assert not (data / "tfrecords" / "cifar10").exists()


def test_dropped_connection_is_resumed_by_the_next_fetch(tmp_path, capsys, cifar10_archive):
    archive, _ = cifar10_archive
    payload = archive.read_bytes()
    data = tmp_path / "data"
    with http_server({"/c.tar.gz": payload}, drop_first=True) as (url, ranges):
        argv = _fetch_argv("cifar10", f"{url}/c.tar.gz", _md5(archive), data, "--retries", "0")
        _fails(capsys, argv, f"{url}/c.tar.gz", "resume")
        part = data / "raw" / ".cifar10.fetching" / "cifar-10-binary.tar.gz.part"
        assert 0 < part.stat().st_size < len(payload)
        assert not (data / "raw" / "cifar10").exists()
        assert main(argv) == 0
        assert ranges == [None, f"bytes={len(payload) // 2}-"]
    assert (data / "raw" / "cifar10" / "cifar-10-binary.tar.gz").read_bytes() == payload


def test_retry_within_one_fetch_resumes_too(tmp_path, cifar10_archive):
    archive, _ = cifar10_archive
    with http_server({"/c.tar.gz": archive.read_bytes()}, drop_first=True) as (url, ranges):
        argv = _fetch_argv("cifar10", f"{url}/c.tar.gz", _md5(archive), tmp_path, "--retries", "1")
        assert main(argv) == 0
        assert len(ranges) == 2 and ranges[1].startswith("bytes=")


def test_missing_file_on_server_is_reported(tmp_path, capsys):
    with http_server({}) as (url, _):
        _fails(
            capsys,
            ["fetch", "cifar10", "--url", f"{url}/nope.tar.gz", "--data-dir", str(tmp_path)],
            "nope.tar.gz",
            "404",
        )


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ({"../evil.txt": b"x"}, "escapes"),
        ({"/etc/evil.txt": b"x"}, "escapes"),
    ],
)
def test_archive_members_escaping_the_target_are_refused(tmp_path, capsys, extra, expected):
    archive = tmp_path / "cifar-10-binary.tar.gz"
    make_cifar10_archive(archive, per_file=2, test=2, extra=extra)
    data = tmp_path / "data"
    _fails(
        capsys,
        [
            "fetch",
            "cifar10",
            "--url",
            str(archive),
            "--md5",
            _md5(archive),
            "--data-dir",
            str(data),
        ],
        str(archive),
        expected,
    )
    assert not (data / "raw").exists()  # nothing left, not even an empty folder


def test_link_members_are_refused(tmp_path, capsys):
    archive = tmp_path / "cifar-10-binary.tar.gz"
    make_cifar10_archive(archive, per_file=2, test=2)
    with (
        tarfile.open(archive, "r:gz") as source,
        tarfile.open(tmp_path / "l.tar.gz", "w:gz") as out,
    ):
        for member in source:
            out.addfile(member, source.extractfile(member))
        link = tarfile.TarInfo("cifar-10-batches-bin/link")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        out.addfile(link)
    linked = tmp_path / "l.tar.gz"
    _fails(
        capsys,
        [
            "fetch",
            "cifar10",
            "--url",
            str(linked),
            "--md5",
            _md5(linked),
            "--data-dir",
            str(tmp_path / "data"),
        ],
        "link",
    )


def test_truncated_archive_is_refused(tmp_path, capsys, cifar10_archive):
    archive, _ = cifar10_archive
    truncated = tmp_path / "cifar-10-binary.tar.gz"
    truncated.write_bytes(archive.read_bytes()[: archive.stat().st_size // 2])
    _fails(
        capsys,
        [
            "fetch",
            "cifar10",
            "--url",
            str(truncated),
            "--md5",
            _md5(truncated),
            "--data-dir",
            str(tmp_path / "data"),
        ],
        str(truncated),
        "truncated",
    )
    assert not (tmp_path / "data" / "raw").exists()


def test_record_file_of_wrong_size_is_refused(tmp_path, capsys):
    archive = tmp_path / "cifar-10-binary.tar.gz"
    make_cifar10_archive(archive, per_file=2, test=2)
    # The same archive with test_batch.bin one byte short.
    bad = tmp_path / "bad.tar.gz"
    with tarfile.open(archive, "r:gz") as source, tarfile.open(bad, "w:gz") as out:
        for member in source:
            content = source.extractfile(member).read()
            if member.name.endswith("test_batch.bin"):
                content = content[:-1]
                member.size = len(content)
            out.addfile(member, io.BytesIO(content))
    _fails(
        capsys,
        _fetch_argv("cifar10", str(bad), _md5(bad), tmp_path / "data"),
        "test_batch.bin",
        "3073",
    )


def test_cifar100_record_size_must_be_a_multiple_of_3074(tmp_path, capsys):
    archive = tmp_path / "cifar-100-binary.tar.gz"
    with tarfile.open(archive, "w:gz") as out:
        for name, content in (
            ("fine_label_names.txt", b"a\nb"),
            ("train.bin", bytes(3073)),
            ("test.bin", bytes(3074)),
        ):
            info = tarfile.TarInfo(f"cifar-100-binary/{name}")
            info.size = len(content)
            out.addfile(info, io.BytesIO(content))
    _fails(
        capsys,
        _fetch_argv("cifar100", str(archive), _md5(archive), tmp_path / "data"),
        "train.bin",
        "3074",
    )


@pytest.mark.parametrize("as_zip", [False, True])
def test_image_folder_becomes_one_uniform_shape(tmp_path, as_zip):
    root = tmp_path / "pets"
    make_image_folder(root / "inner")  # a zip's root folder, as in cifar10-jpeg.zip
    url = root
    if as_zip:
        url = tmp_path / "pets.zip"
        with zipfile.ZipFile(url, "w") as zipped:
            for path in sorted(root.rglob("*")):
                zipped.write(path, path.relative_to(root).as_posix())
        shutil.rmtree(root)
    data = tmp_path / "data"
    assert main(["fetch", "imagefolder", "--url", str(url), "--data-dir", str(data)]) == 0
    assert main(["preprocess", "pets", "--data-dir", str(data), "--shards", "2"]) == 0
    manifest = load_manifest(dataset_dir(data, "pets"))
    assert manifest.classes == ["cat", "dog"]
    assert manifest.image_shape == [16, 16, 3]  # most common size; grayscale made RGB
    assert manifest.splits["train"].per_class == [3, 3]
    images, labels = _decoded(data, "pets", "test")
    assert images.shape == (6, 16, 16, 3) and sorted(labels.tolist()) == [0, 0, 0, 1, 1, 1]


def test_image_folder_class_order_and_size_can_be_given(tmp_path):
    make_image_folder(tmp_path / "pets")
    data = tmp_path / "data"
    assert (
        main(
            [
                "fetch",
                "imagefolder",
                "--url",
                str(tmp_path / "pets"),
                "--classes",
                "dog,cat",
                "--name",
                "p2",
                "--data-dir",
                str(data),
            ]
        )
        == 0
    )
    assert main(["preprocess", "p2", "--image-size", "8", "--data-dir", str(data)]) == 0
    manifest = load_manifest(dataset_dir(data, "p2"))
    assert manifest.classes == ["dog", "cat"] and manifest.image_shape == [8, 8, 3]


def test_corrupt_image_is_named_and_nothing_written(tmp_path, capsys):
    make_image_folder(tmp_path / "pets")
    bad = tmp_path / "pets" / "train" / "cat" / "1.jpg"
    bad.write_bytes(bad.read_bytes()[:200])  # a JPEG cut short
    data = tmp_path / "data"
    assert (
        main(["fetch", "imagefolder", "--url", str(tmp_path / "pets"), "--data-dir", str(data)])
        == 0
    )
    _fails(
        capsys, ["preprocess", "pets", "--data-dir", str(data)], "1.jpg: truncated or damaged JPEG"
    )
    assert not (data / "tfrecords").exists()  # nothing half-written, no empty folder either


def test_non_image_file_is_named(tmp_path, capsys):
    make_image_folder(tmp_path / "pets")
    (tmp_path / "pets" / "test" / "dog" / "notes.jpg").write_text("not an image")
    data = tmp_path / "data"
    main(["fetch", "imagefolder", "--url", str(tmp_path / "pets"), "--data-dir", str(data)])
    _fails(capsys, ["preprocess", "pets", "--data-dir", str(data)], "notes.jpg", "not a JPEG")


def test_empty_class_folder_is_refused(tmp_path, capsys):
    make_image_folder(tmp_path / "pets")
    (tmp_path / "pets" / "train" / "bird").mkdir()
    _fails(
        capsys,
        [
            "fetch",
            "imagefolder",
            "--url",
            str(tmp_path / "pets"),
            "--data-dir",
            str(tmp_path / "data"),
        ],
        "bird",
        "empty class folder",
    )
    assert not (tmp_path / "data" / "raw" / "pets" / "source.json").exists()


def test_unknown_dataset_name(tmp_path, capsys):
    _fails(capsys, ["fetch", "mnist", "--data-dir", str(tmp_path)], "mnist", "unknown dataset")
    _fails(capsys, ["preprocess", "mnist", "--data-dir", str(tmp_path)], "mnist", "fetch")


def test_unwritable_data_dir(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the data dir should be")
    _fails(
        capsys,
        ["fetch", "digits", "--data-dir", str(blocker / "data")],
        str(blocker),
        "not writable",
    )


def test_digits_default_is_deterministic_and_offline(tmp_path):
    for folder in ("a", "b"):
        assert main(["fetch", "--data-dir", str(tmp_path / folder)]) == 0
        assert main(["preprocess", "--data-dir", str(tmp_path / folder)]) == 0
    manifest = load_manifest(dataset_dir(tmp_path / "a", "digits"))
    assert manifest.image_shape == [8, 8, 1]
    assert (manifest.splits["train"].examples, manifest.splits["test"].examples) == (1438, 359)
    assert manifest == load_manifest(dataset_dir(tmp_path / "b", "digits"))
