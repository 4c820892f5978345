"""A user's own images: a folder or zip laid out <root>/<split>/<class>/<image>.

JPEG or PNG, any size, RGB or grayscale. Every image becomes one uniform shape: the size given
by `PreprocessConfig.image_size` (square) or else the most common height x width in the folder
(others are resized bilinearly); 1 channel if every image is grayscale, else 3 (RGB).
Class order: the `classes` given to fetch, or sorted folder names. Hidden files and
`__MACOSX/` are ignored; any other file out of place, unreadable or not an image is an error.
"""

from __future__ import annotations

import io
import shutil
import zipfile
from collections import Counter
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
from PIL import Image, UnidentifiedImageError

from towerbench.config.sections import FetchConfig, PreprocessConfig
from towerbench.core.errors import TowerbenchError
from towerbench.core.files import is_no_space, no_space_error
from towerbench.ingest.archives import check_zip
from towerbench.ingest.base import LoadedDataset
from towerbench.ingest.download import fetch_file, local_path

_COPIED_FOLDER = "images"
_FORMATS = ("JPEG", "PNG")
_GRAYSCALE_MODES = ("1", "L", "LA", "I", "I;16", "F")
# <root>/<split>/<class>/<image>: an image sits three levels below the root.
_LEVELS = 3


class _Tree:
    """Read-only view of a folder or a zip: posix file names, folder names, file bytes."""

    def __init__(self, location: Path) -> None:
        self.location = location
        self._zip = zipfile.ZipFile(location) if location.is_file() else None

    def describe(self, name: str) -> str:
        return f"{self.location}:{name}" if self._zip else str(self.location / name)

    def files_and_folders(self) -> tuple[list[str], set[str]]:
        if self._zip is not None:
            names = self._zip.namelist()
            files = [name for name in names if not name.endswith("/")]
            folders = {name.rstrip("/") for name in names if name.endswith("/")}
        else:
            paths = sorted(self.location.rglob("*"))
            files = [path.relative_to(self.location).as_posix() for path in paths if path.is_file()]
            folders = {
                path.relative_to(self.location).as_posix() for path in paths if path.is_dir()
            }
        for name in files:  # Folders implied by file paths (zips may omit folder entries).
            folders.update(
                str(parent) for parent in PurePosixPath(name).parents if str(parent) != "."
            )
        return files, folders

    def read(self, name: str) -> bytes:
        try:
            if self._zip is not None:
                return self._zip.read(name)
            return (self.location / name).read_bytes()
        except (OSError, zipfile.BadZipFile) as error:
            raise TowerbenchError(f"{self.describe(name)}: unreadable ({error})") from None


def _ignored(name: str) -> bool:
    return any(part.startswith(".") or part == "__MACOSX" for part in PurePosixPath(name).parts)


def index_images(
    tree: _Tree, classes: list[str] | None
) -> tuple[list[str], dict[str, list[tuple[str, int]]]]:
    """Class names and, per split, (file, class index) sorted by class then file name."""
    files, folders = tree.files_and_folders()
    files = sorted(name for name in files if not _ignored(name))
    if not files:
        raise TowerbenchError(f"{tree.location}: no images found")
    depth = max(len(PurePosixPath(name).parts) for name in files)
    root_parts = PurePosixPath(files[0]).parts[: depth - _LEVELS]
    grouped: dict[str, dict[str, list[str]]] = {}
    for name in files:
        parts = PurePosixPath(name).parts
        if len(parts) != depth or depth < _LEVELS or parts[:-_LEVELS] != root_parts:
            raise TowerbenchError(
                f"{tree.describe(name)}: not laid out as <root>/<split>/<class>/<image>"
            )
        split, class_name = parts[-3], parts[-2]
        grouped.setdefault(split, {}).setdefault(class_name, []).append(name)
    for folder in sorted(folders):
        parts = PurePosixPath(folder).parts
        if _ignored(folder) or len(parts) != depth - 1 or parts[:-2] != root_parts:
            continue
        if parts[-1] not in grouped.get(parts[-2], {}):
            raise TowerbenchError(f"{tree.describe(folder)}: empty class folder")
    found = sorted({name for per_class in grouped.values() for name in per_class})
    order = list(classes) if classes else found
    unknown = sorted(set(found) - set(order))
    if unknown:
        raise TowerbenchError(
            f"{tree.location}: class folder(s) {', '.join(unknown)} not in --classes"
        )
    for split, per_class in grouped.items():
        missing = [name for name in order if name not in per_class]
        if missing:
            raise TowerbenchError(
                f"{tree.describe('/'.join((*root_parts, split)))}: no folder for class(es) "
                f"{', '.join(missing)}"
            )
    splits = {
        split: [
            (name, index)
            for index, class_name in enumerate(order)
            for name in per_class[class_name]
        ]
        for split, per_class in sorted(grouped.items())
    }
    return order, splits


def _open(tree: _Tree, name: str) -> Image.Image:
    try:
        image = Image.open(io.BytesIO(tree.read(name)))
    except (UnidentifiedImageError, OSError):
        raise TowerbenchError(f"{tree.describe(name)}: not a JPEG or PNG image") from None
    if image.format not in _FORMATS:
        raise TowerbenchError(f"{tree.describe(name)}: {image.format} image, expected JPEG or PNG")
    return image


def _target_shape(
    tree: _Tree, splits: dict[str, list[tuple[str, int]]], image_size: int | None
) -> tuple[int, int, int]:
    """[H, W, C] every image is converted to, from the headers alone (no decoding)."""
    sizes: Counter[tuple[int, int]] = Counter()
    grayscale = True
    for entries in splits.values():
        for name, _ in entries:
            image = _open(tree, name)
            sizes[(image.height, image.width)] += 1
            grayscale = grayscale and image.mode in _GRAYSCALE_MODES
    height, width = (image_size, image_size) if image_size else sizes.most_common(1)[0][0]
    return height, width, 1 if grayscale else 3


def _decode(
    tree: _Tree, entries: list[tuple[str, int]], shape: tuple[int, int, int]
) -> tuple[np.ndarray, np.ndarray]:
    height, width, channels = shape
    images = np.empty((len(entries), height, width, channels), dtype=np.uint8)
    for position, (name, _) in enumerate(entries):
        image = _open(tree, name)
        try:
            image = image.convert("L" if channels == 1 else "RGB")
            if image.size != (width, height):
                image = image.resize((width, height), Image.Resampling.BILINEAR)
            images[position] = np.asarray(image).reshape(height, width, channels)
        except (OSError, ValueError, SyntaxError) as error:
            raise TowerbenchError(f"{tree.describe(name)}: corrupt image ({error})") from None
    labels = np.array([label for _, label in entries], dtype=np.int64)
    return images, labels


def _copy_folder(source: Path, destination: Path) -> None:
    """Copy the tree at `source` to `destination`; a full disk stops it at the first file."""
    needed = sum(path.stat().st_size for path in source.rglob("*") if path.is_file())

    def copy_file(from_path: str, to_path: str) -> None:
        # copytree would collect the error as text and carry on with the next file.
        try:
            shutil.copy2(from_path, to_path)
        except OSError as error:
            if is_no_space(error):
                raise no_space_error(destination, needed, "the copied images") from None
            raise

    shutil.copytree(source, destination, copy_function=copy_file)


class ImageFolderSource:
    """Copies the folder (or zip) into the raw folder after checking its layout."""

    def fetch(self, config: FetchConfig, folder: Path) -> dict[str, Any]:
        if config.url is None:
            raise TowerbenchError("--url: imagefolder needs the folder or zip to read")
        source = local_path(config.url)
        record: dict[str, Any] = {"source": "imagefolder", "url": config.url}
        if source is not None and source.is_dir():
            if config.md5 is not None:
                raise TowerbenchError(f"--md5: {source} is a folder; md5 applies to a zip")
            index_images(_Tree(source), config.classes)
            _copy_folder(source, folder / _COPIED_FOLDER)
            record["path"] = _COPIED_FOLDER
        else:
            zip_name = PurePosixPath(source.name if source else config.url).name
            if not zip_name.endswith(".zip"):
                raise TowerbenchError(f"--url {config.url}: expected a folder or a .zip file")

            def check(path: Path) -> None:
                check_zip(path)
                index_images(_Tree(path), config.classes)

            record["md5"] = fetch_file(
                config.url, folder / zip_name, config.md5, config.retries, check=check
            )
            record["path"] = zip_name
        record["classes"] = config.classes
        return record

    def load(self, folder: Path, record: dict[str, Any], config: PreprocessConfig) -> LoadedDataset:
        tree = _Tree(folder / record["path"])
        classes, entries = index_images(tree, record.get("classes"))
        shape = _target_shape(tree, entries, config.image_size)
        splits = {split: _decode(tree, items, shape) for split, items in entries.items()}
        return LoadedDataset(classes=classes, splits=splits, source=record)
