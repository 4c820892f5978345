"""Data fixtures built from scratch: official-format CIFAR archives, image folders, HTTP."""

from __future__ import annotations

import contextlib
import http.server
import io
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from PIL import Image

from towerbench.speed.preprocess_rate import CIFAR10_CLASSES


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def cifar10_records(labels: np.ndarray, seed: int) -> tuple[bytes, np.ndarray]:
    """Official CIFAR-10 records for `labels` and the NHWC images they encode."""
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (len(labels), 32, 32, 3), dtype=np.uint8)
    planar = images.transpose(0, 3, 1, 2).reshape(len(labels), -1)  # [N, 3072] R, G, B planes
    return np.concatenate([labels[:, None].astype(np.uint8), planar], axis=1).tobytes(), images


def make_cifar10_archive(
    path: Path, per_file: int = 20, test: int = 20, extra: dict[str, bytes] | None = None
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """A cifar-10-binary.tar.gz with 5 train files and 1 test file; returns the true arrays."""
    splits: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {"train": [], "test": []}
    with tarfile.open(path, "w:gz") as tar:
        _add(tar, "cifar-10-batches-bin/batches.meta.txt", "\n".join(CIFAR10_CLASSES).encode())
        for index, (name, count) in enumerate(
            [(f"data_batch_{i}.bin", per_file) for i in range(1, 6)] + [("test_batch.bin", test)]
        ):
            labels = np.arange(count) % 10
            data, images = cifar10_records(labels, seed=index)
            _add(tar, f"cifar-10-batches-bin/{name}", data)
            splits["test" if name.startswith("test") else "train"].append((images, labels))
        for name, data in (extra or {}).items():
            _add(tar, name, data)
    return {
        split: (np.concatenate([i for i, _ in parts]), np.concatenate([la for _, la in parts]))
        for split, parts in splits.items()
    }


def make_cifar100_archive(path: Path, train: int = 40, test: int = 20) -> np.ndarray:
    """A cifar-100-binary.tar.gz (coarse, fine, pixels); returns the train [coarse, fine] labels."""
    rng = np.random.default_rng(1)
    with tarfile.open(path, "w:gz") as tar:
        _add(
            tar,
            "cifar-100-binary/fine_label_names.txt",
            "\n".join(f"fine{i}" for i in range(100)).encode(),
        )
        _add(
            tar,
            "cifar-100-binary/coarse_label_names.txt",
            "\n".join(f"coarse{i}" for i in range(20)).encode(),
        )
        train_labels = None
        for name, count in (("train.bin", train), ("test.bin", test)):
            fine = rng.integers(0, 100, count)
            labels = np.stack([fine // 5, fine], axis=1).astype(np.uint8)
            pixels = rng.integers(0, 256, (count, 3072), dtype=np.uint8)
            _add(tar, f"cifar-100-binary/{name}", np.concatenate([labels, pixels], 1).tobytes())
            train_labels = labels if train_labels is None else train_labels
    return train_labels


def make_image_folder(root: Path, per_class: int = 3) -> None:
    """<root>/{train,test}/{cat,dog}/ with JPEG and PNG, RGB and grayscale, mixed sizes."""
    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        for class_index, name in enumerate(("cat", "dog")):
            folder = root / split / name
            folder.mkdir(parents=True)
            for index in range(per_class):
                if index == 0 and class_index == 1:
                    image = Image.fromarray(rng.integers(0, 256, (20, 24), dtype=np.uint8), "L")
                    image.save(folder / f"{index}.png")
                else:
                    pixels = rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)
                    Image.fromarray(pixels).save(folder / f"{index}.jpg", quality=95)


class _Handler(http.server.BaseHTTPRequestHandler):
    files: dict[str, bytes]
    requests: list[str | None]
    drop_first: bool

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        data = self.files.get(self.path)
        range_header = self.headers.get("Range")
        self.requests.append(range_header)
        if data is None:
            self.send_error(404)
            return
        start = int(range_header.removeprefix("bytes=").split("-")[0]) if range_header else 0
        if start >= len(data):
            self.send_response(416)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(206 if range_header else 200)
        if range_header:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.send_header("Content-Length", str(len(data) - start))
        self.end_headers()
        body = data[start:]
        if type(self).drop_first and len(self.requests) == 1:
            # Send half the body, then drop the connection as a flaky network would.
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def http_server(files: dict[str, bytes], drop_first: bool = False) -> Iterator[tuple[str, list]]:
    """Serve `files` ({"/name": bytes}) on 127.0.0.1; yields (base URL, Range headers seen)."""
    requests: list[str | None] = []
    handler = type(
        "Handler", (_Handler,), {"files": files, "requests": requests, "drop_first": drop_first}
    )
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", requests
    finally:
        server.shutdown()
        server.server_close()
