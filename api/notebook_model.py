"""A network builder (model=) or a per-example loss (loss=) given as a Python function, made a
file the training processes import.

Training runs in processes of its own (TensorFlow fixes its devices once per process), which know
a function by reference: `path/to/file.py:function`. A function defined in a notebook cell or a
script has no importable home, so it is written, by value (cloudpickle), into a small module under
DATA_DIR/models/ named by the digest of its content, with its source text on top. That file's
sha256 is the run's `model_digest` (`loss_digest`), as for any model file: an edited cell is a new
file, a new sweep; the same cell again is the same file, and a sweep resumes.
"""

from __future__ import annotations

import base64
import hashlib
import inspect
import os
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import cloudpickle  # type: ignore[import-untyped]  # ships no type information

from towerbench.core.errors import TowerbenchError

MODELS = "models"  # under the data dir
# A builder carried by value larger than this closes over data (arrays, a dataset, a model):
# every training process would load it from the file, and every edit would write it again.
LARGEST_PICKLE_BYTES = 8 * 2**20


@dataclass(frozen=True)
class FunctionRole:
    """What a function given from Python is for: the keyword it came by, its name in the
    written module, and the arguments towerbench calls it with."""

    keyword: str
    name: str
    arguments: tuple[str, ...]

    @property
    def signature(self) -> str:
        return f"{self.name}({', '.join(self.arguments)})"


MODEL = FunctionRole("model", "build", ("input_shape", "num_classes"))
LOSS = FunctionRole("loss", "loss", ("y_true", "y_pred"))


def _check_signature(function: Callable[..., object], role: FunctionRole) -> None:
    if role is LOSS and hasattr(function, "reduction") and hasattr(function, "get_config"):
        raise TowerbenchError(
            f"loss=: {type(function).__name__}() is a Keras Loss object, which returns the "
            "batch's mean; pass a function returning one loss per example (keras.losses.huber, "
            "functools.partial(keras.losses.huber, delta=2.0), or your own)"
        )
    try:
        inspect.signature(function).bind(*role.arguments)
    except TypeError:
        raise TowerbenchError(
            f"{role.keyword}=: {getattr(function, '__name__', function)!r} takes "
            f"{inspect.signature(function)}, not {role.signature}"
        ) from None
    except ValueError:  # a builtin without a signature
        raise TowerbenchError(
            f"{role.keyword}=: {function!r} is not a Python function {role.signature}"
        ) from None


def _source(build: Callable[..., object]) -> str:
    try:
        return inspect.getsource(build)
    except (OSError, TypeError):
        return "(source not available)\n"


def _importable_file(build: Callable[..., object]) -> str | None:
    """`file.py:name` when `build` is a module-level function of an importable module's file
    (a partial, or another callable without a name, is carried by value)."""
    module_name, name = getattr(build, "__module__", None), getattr(build, "__name__", None)
    module = sys.modules.get(module_name or "")
    if module is None or name is None or module_name == "__main__":
        return None
    if not getattr(module, "__file__", None):
        return None
    return f"{module.__file__}:{name}" if getattr(module, name, None) is build else None


def _pickled(function: Callable[..., object], role: FunctionRole) -> bytes:
    """`function` by value, unless it carries more than LARGEST_PICKLE_BYTES (one line: load
    the data inside it instead)."""
    pickled: bytes = cloudpickle.dumps(function)
    if len(pickled) > LARGEST_PICKLE_BYTES:
        raise TowerbenchError(
            f"{role.keyword}=: {getattr(function, '__name__', function)!r} carries "
            f"{len(pickled) / 2**20:.0f} MB by value (what it closes over or reads from its "
            f"module: arrays, a dataset, a model), over {LARGEST_PICKLE_BYTES // 2**20} MB: load "
            f"that inside {role.signature} instead, or put the function in a .py file and pass "
            f"path/to/file.py:{role.name}"
        )
    return pickled


def _module_text(function: Callable[..., object], role: FunctionRole) -> str:
    source = _source(function).rstrip("\n")
    where = getattr(function, "__module__", "?")
    pickled = base64.b64encode(_pickled(function, role)).decode()
    quoted = "\n".join(f"#     {line}" for line in source.splitlines())
    return (
        f'"""{role.signature} given to towerbench from Python ({where}); written by '
        'towerbench."""\n'
        "# Its source when it was given:\n"
        f"{quoted}\n"
        "import base64\n\nimport cloudpickle\n\n"
        f'{role.name} = cloudpickle.loads(base64.b64decode("{pickled}"))\n'
    )


def function_file(function: Callable[..., object], data_dir: Path, role: FunctionRole) -> str:
    """The reference that imports `function` (a network builder or a loss, as `role` says): its
    own file when it has an importable one, else DATA_DIR/models/<name>-<digest>.py written
    once (atomically)."""
    _check_signature(function, role)
    if (reference := _importable_file(function)) is not None:
        return reference
    text = _module_text(function, role)
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    folder = Path(data_dir).resolve() / MODELS
    path = folder / f"{role.name}-{digest}.py"
    if not path.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=folder, suffix=".tmp")
        with os.fdopen(handle, "w") as file:
            file.write(text)
        os.replace(temporary, path)
    return f"{path}:{role.name}"
