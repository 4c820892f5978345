"""A network builder given as a Python function, made a model file the training processes import.

Training runs in processes of its own (TensorFlow fixes its devices once per process), which know
a network by reference: `path/to/file.py:function`. A function defined in a notebook cell or a
script has no importable home, so it is written, by value (cloudpickle), into a small module under
DATA_DIR/models/ named by the digest of its content, with its source text on top. That file's
sha256 is the run's `model_digest`, as for any model file: an edited cell is a new file, a new
sweep; the same cell again is the same file, and a sweep resumes.
"""

from __future__ import annotations

import base64
import hashlib
import inspect
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import cloudpickle  # type: ignore[import-untyped]  # ships no type information

from towerbench.core.errors import TowerbenchError

MODELS = "models"  # under the data dir
SIGNATURE = "build(input_shape, num_classes)"
# A builder carried by value larger than this closes over data (arrays, a dataset, a model):
# every training process would load it from the file, and every edit would write it again.
LARGEST_PICKLE_BYTES = 8 * 2**20


def _check_signature(build: Callable[..., object]) -> None:
    try:
        inspect.signature(build).bind("input_shape", "num_classes")
    except TypeError:
        raise TowerbenchError(
            f"model=: {getattr(build, '__name__', build)!r} takes "
            f"{inspect.signature(build)}, not {SIGNATURE}"
        ) from None
    except ValueError:  # a builtin without a signature
        raise TowerbenchError(f"model=: {build!r} is not a Python function {SIGNATURE}") from None


def _source(build: Callable[..., object]) -> str:
    try:
        return inspect.getsource(build)
    except (OSError, TypeError):
        return "(source not available)\n"


def _importable_file(build: Callable[..., object]) -> str | None:
    """`file.py:name` when `build` is a module-level function of an importable module's file."""
    module = sys.modules.get(build.__module__)
    if module is None or build.__module__ == "__main__" or not getattr(module, "__file__", None):
        return None
    name = build.__name__
    return f"{module.__file__}:{name}" if getattr(module, name, None) is build else None


def _pickled(build: Callable[..., object]) -> bytes:
    """`build` by value, unless it carries more than LARGEST_PICKLE_BYTES (one line: load the
    data inside it instead)."""
    pickled: bytes = cloudpickle.dumps(build)
    if len(pickled) > LARGEST_PICKLE_BYTES:
        raise TowerbenchError(
            f"model=: {getattr(build, '__name__', build)!r} carries {len(pickled) / 2**20:.0f} MB "
            f"by value (what it closes over or reads from its module: arrays, a dataset, a "
            f"model), over {LARGEST_PICKLE_BYTES // 2**20} MB: load that inside {SIGNATURE} "
            "instead, or put the function in a .py file and pass path/to/file.py:build"
        )
    return pickled


def _module_text(build: Callable[..., object]) -> str:
    source = _source(build).rstrip("\n")
    where = getattr(build, "__module__", "?")
    pickled = base64.b64encode(_pickled(build)).decode()
    quoted = "\n".join(f"#     {line}" for line in source.splitlines())
    return (
        f'"""{SIGNATURE} given to towerbench from Python ({where}); written by towerbench."""\n'
        "# Its source when it was given:\n"
        f"{quoted}\n"
        "import base64\n\nimport cloudpickle\n\n"
        f'build = cloudpickle.loads(base64.b64decode("{pickled}"))\n'
    )


def model_file(build: Callable[..., object], data_dir: Path) -> str:
    """The model reference that trains `build`: its own file when it has an importable one,
    else DATA_DIR/models/build-<digest>.py written once (atomically)."""
    _check_signature(build)
    if (reference := _importable_file(build)) is not None:
        return reference
    text = _module_text(build)
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    folder = Path(data_dir).resolve() / MODELS
    path = folder / f"build-{digest}.py"
    if not path.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=folder, suffix=".tmp")
        with os.fdopen(handle, "w") as file:
            file.write(text)
        os.replace(temporary, path)
    return f"{path}:build"
