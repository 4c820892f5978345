"""TensorFlow's C++ logging (absl, oneDNN, CUDA probing) kept off stderr unless asked for, on the
command line and from Python alike.

Two kinds of lines: those its native libraries print while they load, before any log level
applies (dropped by capturing stderr around the import; without CUDA "Could not find cuda
drivers" comes twice, each after absl's note that logging is not set up yet), and those logged
later, which `TF_CPP_MIN_LOG_LEVEL` silences (set in the environment, it reaches the processes
this one starts too).
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import re
import sys
import tempfile
from collections.abc import Iterator, Sequence
from types import ModuleType
from typing import IO, Any

_NATIVE_LOG_LINE = re.compile(
    r"^(?:[IWEF]\d{4} \S+\s+\d+ |WARNING: All log messages before absl::InitializeLog)"
)
_TIME_AND_THREAD = re.compile(r"^[IWEF]\d{4} \S+\s+\d+ ")

# Set beside the level when towerbench chose it, so that the processes it starts (the workers
# of `--workers N`, which inherit both) do not take towerbench's choice for the user's.
_OURS = "TOWERBENCH_CHOSE_TF_CPP_MIN_LOG_LEVEL"
# Read when towerbench is first imported, before it sets the level itself.
_LEVEL_SET_BY_USER = "TF_CPP_MIN_LOG_LEVEL" in os.environ and _OURS not in os.environ
_native_logs_shown = _LEVEL_SET_BY_USER


def quiet_native_logs(verbose: bool) -> None:
    """Keep TensorFlow's C++ logging off stderr unless `verbose` or the user set its level."""
    global _native_logs_shown
    _native_logs_shown = verbose or _LEVEL_SET_BY_USER
    if not _LEVEL_SET_BY_USER:
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "0" if verbose else "3"
        os.environ[_OURS] = "1"


@contextlib.contextmanager
def stderr_redirected(target: IO[Any]) -> Iterator[None]:
    """File descriptor 2, where native code writes too, into `target` while the block runs."""
    sys.stderr.flush()
    saved = os.dup(2)
    os.dup2(target.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


@contextlib.contextmanager
def native_lines_handled() -> Iterator[None]:
    """While the block runs, what is written to stderr (file descriptor 2) is held back; then
    written without the native log lines, or with each only once when they are wanted."""
    with tempfile.TemporaryFile("w+b") as capture:
        try:
            with stderr_redirected(capture):
                yield
        finally:
            capture.seek(0)
            sys.stderr.write(_kept(capture.read().decode(errors="replace")))
            sys.stderr.flush()


def _kept(text: str) -> str:
    seen: set[str] = set()
    kept = []
    for line in text.splitlines(keepends=True):
        if _NATIVE_LOG_LINE.match(line):
            message = _TIME_AND_THREAD.sub("", line)
            if message in seen or not _native_logs_shown:
                continue
            seen.add(message)
        kept.append(line)
    return "".join(kept)


def import_tensorflow() -> None:
    """Import TensorFlow with its native libraries' start-up lines handled."""
    if "tensorflow" not in sys.modules:
        with native_lines_handled():
            import tensorflow  # noqa: F401 - imported for its side effect: the runtime is loaded


class _QuietLoader(importlib.abc.Loader):
    """TensorFlow's own loader, its package's first execution run with the lines handled."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self.loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        with native_lines_handled():
            self.loader.exec_module(module)

    def __getattr__(self, name: str) -> object:  # the rest of a loader's face (is_package, ...)
        return getattr(self.loader, name)


class _QuietTensorFlowImport(importlib.abc.MetaPathFinder):
    """Finds `tensorflow` once, as the other finders would, with a loader that handles the lines
    its start-up prints; then steps aside."""

    def find_spec(
        self, name: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if name != "tensorflow":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            spec.loader = _QuietLoader(spec.loader)
        return spec


def quiet_tensorflow_import() -> None:
    """Whoever imports TensorFlow next in this process (a user's `import keras` after
    `import towerbench`) sees none of its C++ logging, unless TF_CPP_MIN_LOG_LEVEL is set."""
    if "tensorflow" in sys.modules or _LEVEL_SET_BY_USER:
        return
    quiet_native_logs(verbose=False)
    if not any(isinstance(finder, _QuietTensorFlowImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _QuietTensorFlowImport())
