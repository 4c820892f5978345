"""Arrays as a dataset: `((x_train, y_train), (x_test, y_test))`, checked and saved once as an .npz.

The .npz has Keras' mnist.npz layout (keys x_train, y_train, x_test, y_test). Examples are any
of FEATURE_DTYPES, of any rank >= 1 beyond the example axis, the same shape in both splits.
Labels are either integer class indices 0..K-1 with K = the largest train label + 1, given as
(N,) or (N, 1) (as keras.datasets' CIFAR-10), or label rows (N, L) of the same width in both
splits: floats (regression targets, one-hot or soft class rows; a float (N,) is one target
column) or integers and booleans with L >= 2 (multi-hot tags), stored as float32. Every refusal
is one line naming the array and the fault.

`save_arrays` writes DATA_DIR/arrays/<name>.npz: the *input* of the `arrays` source's fetch
(`towerbench fetch arrays --url DATA_DIR/arrays/<name>.npz --name <name>`), which copies it to
DATA_DIR/raw/<name>/<name>.npz like any source's download. It cannot live in
DATA_DIR/raw/<name>/ itself: that folder is the DVC fetch stage's output, which DVC deletes
before it runs the stage. The file is deterministic (no timestamps in the zip), so the same
arrays are the same bytes: saving them again reuses the file, other arrays under the same name
are refused.
"""

from __future__ import annotations

import os
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from towerbench.config.names import name_problem
from towerbench.config.sections import FetchConfig, PreprocessConfig, dataset_name
from towerbench.core.errors import TowerbenchError
from towerbench.core.files import space_errors
from towerbench.core.tfrecord_format import FEATURE_DTYPES
from towerbench.ingest.base import LoadedDataset
from towerbench.ingest.download import fetch_file, file_md5

KEYS = ("x_train", "y_train", "x_test", "y_test")
ARRAYS_FOLDER = "arrays"  # DATA_DIR/arrays/<name>.npz: what save_arrays writes
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # the earliest a zip can say: no time in the file
_INT32 = np.iinfo(np.int32)

Split = tuple[np.ndarray, np.ndarray]


def _features(key: str, values: Any) -> np.ndarray:
    """`values` as an array of a feature dtype and rank >= 2, with finite floats."""
    values = np.asarray(values)
    if values.dtype.name not in FEATURE_DTYPES:
        raise TowerbenchError(
            f"{key}: dtype {values.dtype} is not one of {', '.join(FEATURE_DTYPES)} "
            "(cast it, e.g. x.astype('float32'))"
        )
    if values.ndim < 2:
        raise TowerbenchError(
            f"{key}: shape {values.shape} has no axis beyond the examples' (one example per "
            f"row: reshape to ({len(values)}, 1))"
        )
    if len(values) == 0:
        raise TowerbenchError(f"{key}: no examples")
    if values.dtype.kind == "f" and not np.isfinite(values).all():
        row = int(np.argwhere(~np.isfinite(values))[0][0])
        raise TowerbenchError(f"{key}: NaN or inf in the features (example {row})")
    if values.dtype == np.int64 and (values.min() < _INT32.min or values.max() > _INT32.max):
        raise TowerbenchError(f"{key}: int64 values beyond int32's range (ids are fed as int32)")
    return values


def _label_rows(key: str, labels: np.ndarray) -> np.ndarray:
    """Float or multi-hot `labels` as float32 rows [N, L], finite."""
    rows = labels.reshape(-1, 1) if labels.ndim == 1 else labels
    if rows.ndim != 2:
        raise TowerbenchError(f"{key}: shape {labels.shape}; label rows must be (N,) or (N, L)")
    rows = rows.astype(np.float32)
    if not np.isfinite(rows).all():
        row = int(np.argwhere(~np.isfinite(rows))[0][0])
        raise TowerbenchError(f"{key}: NaN or inf in the labels (example {row}, as float32)")
    return rows


def _labels(key: str, labels: Any, examples: int) -> np.ndarray:
    """`labels` as int64 class ids [N] (integers >= 0, one per example) or float32 rows [N, L]."""
    labels = np.asarray(labels)
    if labels.dtype.kind not in "iubf":
        raise TowerbenchError(
            f"{key}: labels are {labels.dtype}; give integer class ids 0..K-1 or numeric rows"
        )
    if labels.ndim == 2 and labels.shape[1] == 1 and labels.dtype.kind in "iu":
        labels = labels[:, 0]  # keras.datasets.cifar10's (N, 1)
    if len(labels) != examples:
        raise TowerbenchError(
            f"{key}: {len(labels)} labels for the {examples} examples of x_{key[2:]}"
        )
    if labels.dtype.kind == "f" or labels.ndim > 1 or labels.dtype.kind == "b":
        return _label_rows(key, labels)
    if labels.min() < 0:
        raise TowerbenchError(f"{key}: negative label {labels.min()}; labels are 0..K-1")
    return labels.astype(np.int64)


def _listed(values: np.ndarray, shown: int = 5) -> str:
    """`3, 4, 5, 6, 7 and 2 more`: the first few of `values`."""
    text = ", ".join(str(value) for value in values[:shown])
    return f"{text} and {values.size - shown} more" if values.size > shown else text


def _class_count(y_train: np.ndarray, y_test: np.ndarray) -> int:
    """K of class ids 0..K-1: every one present in y_train, none beyond it in y_test."""
    classes = int(y_train.max()) + 1
    if classes < 2:
        raise TowerbenchError("y_train: every label is 0; classifying needs 2 classes or more")
    absent = np.setdiff1d(np.arange(classes), y_train)
    if absent.size:
        raise TowerbenchError(
            f"y_train: label {classes - 1} implies {classes} classes, but {absent.size} of "
            f"them have no example ({_listed(absent)}); labels must be 0..K-1, each present"
        )
    if y_test.max() >= classes:
        raise TowerbenchError(
            f"y_test: label {y_test.max()}, but y_train's largest is {classes - 1} "
            f"({classes} classes implied)"
        )
    return classes


def _column_count(y_train: np.ndarray, y_test: np.ndarray) -> int:
    """L of label rows (N, L): the same in both splits, which are both rows."""
    if y_test.ndim != y_train.ndim:
        kinds = {1: "class ids", 2: "label rows"}
        raise TowerbenchError(f"y_test: {kinds[y_test.ndim]}, y_train's are {kinds[y_train.ndim]}")
    if y_test.shape[1] != y_train.shape[1]:
        raise TowerbenchError(
            f"y_test: label rows of {y_test.shape[1]} columns, y_train's have {y_train.shape[1]}"
        )
    return int(y_train.shape[1])


def check_arrays(arrays: dict[str, Any], where: str) -> tuple[dict[str, Split], list[str]]:
    """{train, test: (examples, labels)} of `arrays` (keyed by KEYS), and the names of the
    classes or label columns (`0`, `1`, ...), or a one-line TowerbenchError starting with
    `where` (the file, or `data`)."""
    try:
        splits: dict[str, Split] = {}
        for split in ("train", "test"):
            values = _features(f"x_{split}", arrays[f"x_{split}"])
            splits[split] = (values, _labels(f"y_{split}", arrays[f"y_{split}"], len(values)))
        (x_train, y_train), (x_test, y_test) = splits["train"], splits["test"]
        if (x_test.shape[1:], x_test.dtype) != (x_train.shape[1:], x_train.dtype):
            raise TowerbenchError(
                f"x_test: examples of shape {x_test.shape[1:]} {x_test.dtype}, x_train's are "
                f"{x_train.shape[1:]} {x_train.dtype}"
            )
        if y_train.ndim == 2 or y_test.ndim == 2:
            width = _column_count(y_train, y_test)
        else:
            width = _class_count(y_train, y_test)
    except TowerbenchError as error:
        raise TowerbenchError(f"{where}: {error}") from None
    return splits, [str(index) for index in range(width)]


def read_npz(path: Path) -> dict[str, np.ndarray]:
    """The four arrays of the .npz at `path`, or one line naming the file and the fault."""
    try:
        loaded = np.load(path, allow_pickle=False)  # a .npy gives one array, no archive to close
        if not isinstance(loaded, np.lib.npyio.NpzFile):
            raise TowerbenchError(f"{path}: a single array, not an .npz of {', '.join(KEYS)}")
        with loaded as archive:
            missing = [key for key in KEYS if key not in archive.files]
            if missing:
                raise TowerbenchError(
                    f"{path}: no {missing[0]!r} array (an .npz needs {', '.join(KEYS)}, as "
                    "keras.datasets' mnist.npz)"
                )
            return {key: archive[key] for key in KEYS}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as error:
        detail = " ".join(str(error).split())[:200] or type(error).__name__
        raise TowerbenchError(f"{path}: not a readable .npz ({detail})") from None


def _write_npz(path: Path, splits: dict[str, Split]) -> None:
    """np.savez's layout, without the time of writing: the same arrays give the same bytes."""
    arrays = {"x_train": splits["train"][0], "y_train": splits["train"][1]}
    arrays |= {"x_test": splits["test"][0], "y_test": splits["test"][1]}
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
        for key, array in arrays.items():
            info = zipfile.ZipInfo(f"{key}.npy", date_time=_ZIP_TIME)
            info.external_attr = 0o644 << 16
            with archive.open(info, "w", force_zip64=True) as handle:
                np.lib.format.write_array(handle, np.ascontiguousarray(array), allow_pickle=False)


def _publish(temp: Path, target: Path, name: str) -> None:
    """Put `temp` at `target` unless it exists; then it must hold the same arrays."""
    try:
        os.link(temp, target)  # fails if another save got there first: never overwrites
    except FileExistsError:
        if file_md5(target) != file_md5(temp):
            raise TowerbenchError(
                f"name {name!r}: {target} holds other arrays; pass another name, or delete "
                "that file to replace them"
            ) from None
    except OSError:  # a file system without hard links: the rename, checked just before
        os.replace(temp, target)


def save_arrays(train: Split, test: Split, data_dir: Path, name: str | None = None) -> Path:
    """Check `train` and `test` ((x, y) each, as keras.datasets' load_data returns them) and
    write them once as DATA_DIR/arrays/<name>.npz; return its path. `name` defaults to
    `arrays-` and the start of the content's md5, so the same arrays get the same name."""
    arrays = dict(zip(KEYS, (*train, *test), strict=True))
    splits, _ = check_arrays(arrays, "data")
    if name is not None and name_problem(name) is not None:
        raise TowerbenchError(f"name: {name_problem(name)} (got {name!r})")
    folder = Path(data_dir) / ARRAYS_FOLDER
    needed = sum(values.nbytes + labels.nbytes for values, labels in splits.values())
    with space_errors(folder, needed, "the arrays"):
        folder.mkdir(parents=True, exist_ok=True)
        handle, temp_name = tempfile.mkstemp(prefix=".arrays-", suffix=".npz", dir=folder)
        os.close(handle)
        temp = Path(temp_name)
        try:
            _write_npz(temp, splits)
            os.chmod(temp, 0o644)
            name = name or f"arrays-{file_md5(temp)[:12]}"
            target = folder / f"{name}.npz"
            _publish(temp, target, name)
        finally:
            temp.unlink(missing_ok=True)
    return target


def fetch_config(path: Path, name: str) -> FetchConfig:
    """The fetch settings that bring the .npz at `path` in as dataset `name`; its md5 is a
    parameter, so DVC's fetch stage is stale exactly when the arrays change."""
    return FetchConfig(
        source="arrays", url=str(Path(path).resolve()), md5=file_md5(path), name=name
    )


class ArraysSource:
    """An .npz of x_train, y_train, x_test, y_test from a path or URL, copied into the raw
    folder once its md5 (when given) matches and its arrays pass `check_arrays`."""

    def _check(self, path: Path) -> None:
        check_arrays(read_npz(path), str(path))

    def fetch(self, config: FetchConfig, folder: Path) -> dict[str, Any]:
        if config.url is None:
            raise TowerbenchError(
                f"--url: the arrays source reads an .npz of {', '.join(KEYS)}; give its path or URL"
            )
        target = folder / f"{dataset_name(config)}.npz"
        md5 = config.md5.lower() if config.md5 else None
        if md5 is None or not (target.is_file() and file_md5(target) == md5):
            md5 = fetch_file(config.url, target, md5, config.retries, check=self._check)
        return {"source": "arrays", "url": config.url, "md5": md5, "file": target.name}

    def load(self, folder: Path, record: dict[str, Any], config: PreprocessConfig) -> LoadedDataset:
        path = folder / record["file"]
        splits, names = check_arrays(read_npz(path), str(path))
        return LoadedDataset(names, splits, record)
