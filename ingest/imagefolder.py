"""A user's own images: a folder or zip laid out <root>/<split>/<class>/<image>.

JPEG or PNG, any size, RGB or grayscale. Every image becomes one uniform shape: the size given
by `PreprocessConfig.image_size` (square) or else the most common height x width in the folder
(others are resized bilinearly); 1 channel if every image is grayscale, else 3 (RGB).
Class order: the `classes` given to fetch, or sorted folder names. The folder needs a `train`
and a `test` split (others are kept too). Hidden files and `__MACOSX/` are ignored; any other
file out of place, unreadable or not an image is an error. A link is followed only to a regular
file inside the folder (and copied as that file); any other link, and FIFOs, sockets and
devices, are refused: nothing outside the folder is ever read.
"""

from __future__ import annotations

import io
import os
import stat
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
# How a file of each format begins, to tell a damaged image from a file that is no image at all.
_SIGNATURES = {"PNG": b"\x89PNG\r\n\x1a\n", "JPEG": b"\xff\xd8\xff"}
_REQUIRED_SPLITS = ("train", "test")  # what training reads and evaluates on
_GRAYSCALE_MODES = ("1", "L", "LA", "I", "I;16", "F")
# <root>/<split>/<class>/<image>: an image sits three levels below the root.
_LEVELS = 3


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a regular file"


def _file_inside(root: Path, path: Path) -> Path:
    """The regular file `path` stands for: itself, or the file a link points to inside `root`
    (resolved); anything else is refused, naming `path`."""
    target = path.resolve() if path.is_symlink() else path
    if path.is_symlink() and not target.is_relative_to(root):
        raise TowerbenchError(
            f"{path}: a link to {target}, outside {root}: refused (copy the file in instead)"
        )
    try:
        mode = target.lstat().st_mode
    except FileNotFoundError:
        raise TowerbenchError(f"{path}: a link to {target}, which does not exist") from None
    if not stat.S_ISREG(mode):
        link = f"a link to {target}, " if target != path else ""
        raise TowerbenchError(f"{path}: {link}{_kind(mode)}: refused (only image files are read)")
    return target


def _read_inside(root: Path, path: Path) -> bytes:
    """The bytes of the regular file `path` stands for in `root`, checked again as it is
    opened (no link is followed, a FIFO is not waited on)."""
    target = _file_inside(root, path)
    handle = os.open(target, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(handle, "rb") as opened:
        if not stat.S_ISREG(os.fstat(opened.fileno()).st_mode):
            raise TowerbenchError(f"{path}: changed while being read: refused")
        return opened.read()


class _Tree:
    """Read-only view of a folder or a zip: posix file names, folder names, file bytes."""

    def __init__(self, location: Path) -> None:
        self.location = location
        self._zip = zipfile.ZipFile(location) if location.is_file() else None
        self._root = location.resolve()

    def describe(self, name: str) -> str:
        return f"{self.location}:{name}" if self._zip else str(self.location / name)

    def _walk(self) -> tuple[list[str], set[str]]:
        """A folder's files and folders, links checked (`_file_inside`), none followed."""
        files: list[str] = []
        folders: set[str] = set()
        for top, subfolders, names in os.walk(self.location):
            relative = Path(top).relative_to(self.location)
            for name in sorted(subfolders):
                link = Path(top) / name
                if link.is_symlink() and not _ignored((relative / name).as_posix()):
                    _file_inside(self._root, link)  # a link to a folder: refused
            folders.update((relative / name).as_posix() for name in subfolders)
            for name in names:
                if not _ignored((relative / name).as_posix()):
                    _file_inside(self._root, Path(top) / name)
                    files.append((relative / name).as_posix())
        return files, folders

    def files_and_folders(self) -> tuple[list[str], set[str]]:
        if self._zip is not None:
            names = self._zip.namelist()
            files = [name for name in names if not name.endswith("/")]
            folders = {name.rstrip("/") for name in names if name.endswith("/")}
        else:
            files, folders = self._walk()
        for name in files:  # Folders implied by file paths (zips may omit folder entries).
            folders.update(
                str(parent) for parent in PurePosixPath(name).parents if str(parent) != "."
            )
        return files, folders

    def read(self, name: str) -> bytes:
        try:
            if self._zip is not None:
                return self._zip.read(name)
            return _read_inside(self._root, self.location / name)
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
    missing_splits = [split for split in _REQUIRED_SPLITS if split not in grouped]
    if missing_splits:
        raise TowerbenchError(
            f"{tree.describe('/'.join(root_parts)) if root_parts else tree.location}: no "
            f"{' or '.join(missing_splits)} split (found: {', '.join(sorted(grouped))}); "
            "towerbench trains on <root>/train/<class>/ and evaluates on <root>/test/<class>/"
        )
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


def _damaged(tree: _Tree, name: str, data: bytes, error: Exception) -> TowerbenchError:
    """The error for an image that cannot be read: damaged when it begins like one."""
    detail = "" if isinstance(error, UnidentifiedImageError) else f" ({error})"
    for kind, signature in _SIGNATURES.items():
        if data and data[: len(signature)] == signature[: len(data)]:
            return TowerbenchError(
                f"{tree.describe(name)}: truncated or damaged {kind} image{detail}"
            )
    return TowerbenchError(f"{tree.describe(name)}: not a JPEG or PNG image")


def _open(tree: _Tree, name: str) -> Image.Image:
    data = tree.read(name)
    try:
        image = Image.open(io.BytesIO(data))
    except (UnidentifiedImageError, OSError, SyntaxError) as error:
        raise _damaged(tree, name, data, error) from None
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
            raise TowerbenchError(
                f"{tree.describe(name)}: truncated or damaged {image.format} image ({error})"
            ) from None
    labels = np.array([label for _, label in entries], dtype=np.int64)
    return images, labels


def _copy_images(tree: _Tree, names: list[str], destination: Path) -> None:
    """Copy the image files `names` of the folder `tree` (a link as the file it points to) to
    `destination`; a full disk stops it at the first file."""
    root = tree.location.resolve()
    needed = sum(_file_inside(root, tree.location / name).stat().st_size for name in names)
    for name in names:
        target = destination / name
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            target.write_bytes(tree.read(name))
        except OSError as error:
            if is_no_space(error):
                raise no_space_error(destination, needed, "the copied images") from None
            raise


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
            tree = _Tree(source)
            _, splits = index_images(tree, config.classes)
            names = [name for entries in splits.values() for name, _ in entries]
            _copy_images(tree, names, folder / _COPIED_FOLDER)
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
