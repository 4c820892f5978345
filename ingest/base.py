"""The interface every dataset source implements."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from towerbench.config.sections import FetchConfig, PreprocessConfig


@dataclass(frozen=True)
class LoadedDataset:
    """Decoded arrays ready for `write_dataset`."""

    classes: list[str]
    # split -> (uint8 images [N, H, W, C] or examples [N, ...] of a feature dtype; labels:
    # int class ids [N] or float rows [N, len(classes)])
    splits: dict[str, tuple[np.ndarray, np.ndarray]]
    source: dict[str, Any]  # provenance, copied into the manifest


class Source(Protocol):
    """fetch: put verified raw data into a folder; load: decode it into arrays."""

    def fetch(self, config: FetchConfig, folder: Path) -> dict[str, Any]:
        """Fill `folder` (it exists, and may hold a partial download or, hard-linked, the files
        of the version being replaced); return the source record."""
        ...

    def load(self, folder: Path, record: dict[str, Any], config: PreprocessConfig) -> LoadedDataset:
        """Decode `folder`'s raw data, described by `record`, into arrays."""
        ...
