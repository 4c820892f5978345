"""The embedded default: scikit-learn's bundled 8x8 handwritten digits (1,797 images, no network).

Pixels 0-16 are scaled to 0-255. The split is fixed by position, with no randomness:
every fifth image (index % 5 == 4) is test, the rest train (1,438 / 359 images).
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np

from towerbench.config.sections import FetchConfig, PreprocessConfig
from towerbench.core.errors import TowerbenchError
from towerbench.core.files import write_atomically
from towerbench.ingest.base import LoadedDataset

_IMAGES = "images.npy"
_LABELS = "labels.npy"
_TEST_EVERY = 5


def _npy_bytes(array: np.ndarray) -> bytes:
    # np.save's format has no timestamps, so the raw folder is byte-identical on every fetch.
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


class DigitsSource:
    """sklearn.datasets.load_digits as uint8 [N, 8, 8, 1] images."""

    def fetch(self, config: FetchConfig, folder: Path) -> dict[str, Any]:
        if config.url is not None or config.md5 is not None:
            raise TowerbenchError("--url/--md5: digits is bundled with scikit-learn, not fetched")
        # Imported here: 2 s that every process importing `ingest` would pay otherwise.
        import sklearn
        from sklearn.datasets import load_digits

        bunch = load_digits()
        images = np.rint(bunch.images * (255.0 / 16.0)).astype(np.uint8)[..., np.newaxis]
        write_atomically(folder / _IMAGES, _npy_bytes(images))
        write_atomically(folder / _LABELS, _npy_bytes(bunch.target.astype(np.int64)))
        return {
            "source": "digits",
            "url": "sklearn.datasets.load_digits",
            "scikit_learn": sklearn.__version__,
        }

    def load(self, folder: Path, record: dict[str, Any], config: PreprocessConfig) -> LoadedDataset:
        try:
            images = np.load(folder / _IMAGES)
            labels = np.load(folder / _LABELS)
        except (OSError, ValueError) as error:
            raise TowerbenchError(f"{folder}: unreadable digits arrays ({error})") from None
        is_test = np.arange(len(labels)) % _TEST_EVERY == _TEST_EVERY - 1
        return LoadedDataset(
            classes=[str(digit) for digit in range(10)],
            splits={
                "train": (images[~is_test], labels[~is_test]),
                "test": (images[is_test], labels[is_test]),
            },
            source=record,
        )
