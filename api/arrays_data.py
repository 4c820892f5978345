"""`data=((x_train, y_train), (x_test, y_test))`: arrays made a dataset the way the CLI makes one.

The arrays are checked and written once as DATA_DIR/arrays/<name>.npz (ingest.arrays), then
brought in as `towerbench fetch arrays --url <that file>` and `towerbench preprocess` do. In a DVC
project (a .dvc/ above and towerbench's dvc.yaml in the folder) they go through its stages, as
`towerbench pipeline` builds data, and the sweep records DVC's hash as the data version; elsewhere
the same fetch and preprocess run directly. The same arrays again reuse what was built.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from towerbench.config.sections import FetchConfig, PreprocessConfig
from towerbench.core.errors import TowerbenchError
from towerbench.core.tfrecord_format import MANIFEST_NAME, dataset_dir

Split = tuple[np.ndarray, np.ndarray]
Arrays = tuple[Split, Split]
SHAPE = "((x_train, y_train), (x_test, y_test)), as keras.datasets.*.load_data() returns"


def _splits(data: Any) -> Arrays:
    try:
        (x_train, y_train), (x_test, y_test) = data
    except (TypeError, ValueError):
        raise TowerbenchError(f"data=: expected {SHAPE}") from None
    return (np.asarray(x_train), np.asarray(y_train)), (np.asarray(x_test), np.asarray(y_test))


def is_dvc_project(folder: Path) -> bool:
    from towerbench.tasks.data.dvc_stages import STAGES_FILE

    folder = folder.resolve()
    in_repository = any((above / ".dvc").is_dir() for above in (folder, *folder.parents))
    return in_repository and (folder / STAGES_FILE).is_file()


def _built_directly(fetch: FetchConfig, data_dir: Path) -> None:
    """`towerbench fetch` then `towerbench preprocess`, skipped when these arrays are built."""
    from towerbench.ingest import fetch as fetch_dataset
    from towerbench.ingest import preprocess
    from towerbench.ingest.layout import raw_dir, read_source_record

    name = fetch.name or ""
    raw = raw_dir(data_dir, name)
    built = (dataset_dir(data_dir, name) / MANIFEST_NAME).is_file() and raw.is_dir()
    if built and read_source_record(raw).get("md5") == fetch.md5:
        return
    fetch_dataset(fetch, data_dir)
    preprocess(name, PreprocessConfig(), data_dir)


def dataset_from_arrays(
    data: Any, name: str | None, data_dir: Path, project: Path
) -> tuple[str, str | None]:
    """The preprocessed dataset made of the arrays `data` (checked, one line each): its name,
    and DVC's hash of it when it was built through the stages of the DVC project `project`."""
    from towerbench.ingest.arrays import fetch_config, save_arrays

    train, test = _splits(data)
    npz = save_arrays(train, test, data_dir, name)
    fetch = fetch_config(npz, npz.stem)
    if is_dvc_project(project):
        from towerbench.tasks.data.dvc_stages import data_stages, update_dataset

        return npz.stem, update_dataset(data_stages(project, fetch, PreprocessConfig(), data_dir))
    _built_directly(fetch, data_dir)
    return npz.stem, None
