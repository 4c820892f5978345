"""What the CLI writes where: under `--json` stdout carries the result document and nothing else;
TensorFlow's C++ logging (absl, oneDNN, CUDA probing) stays off stderr unless the user asks for it
(`--verbose`, or TF_CPP_MIN_LOG_LEVEL set in their environment), and is then shown once."""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from typing import Any, NamedTuple, TextIO

# Lines TensorFlow's native libraries print while they load, each library once: without CUDA,
# "Could not find cuda drivers" twice, each after absl's note that logging is not set up yet.
_NATIVE_LOG_LINE = re.compile(
    r"^(?:[IWEF]\d{4} \S+\s+\d+ |WARNING: All log messages before absl::InitializeLog)"
)
_TIME_AND_THREAD = re.compile(r"^[IWEF]\d{4} \S+\s+\d+ ")


class CommandResult(NamedTuple):
    """A command's exit status, the document `--json` prints and, when it failed after all,
    its last line (said as an error is)."""

    status: int
    document: dict[str, Any]
    failure: str | None = None


@contextlib.contextmanager
def stdout_reserved() -> Iterator[TextIO]:
    """Send everything written to stdout, by this process or the processes it starts, to stderr;
    yields the real stdout, to write the result to after the block."""
    result_stream = sys.stdout
    for stream in (sys.stdout, sys.__stdout__):
        if stream is not None:
            stream.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield result_stream
    finally:
        for stream in (sys.stderr, sys.__stdout__):
            if stream is not None:
                stream.flush()
        os.dup2(saved, 1)
        os.close(saved)


_native_logs_shown = True  # until `quiet_native_logs` decides


def quiet_native_logs(verbose: bool) -> None:
    """Keep TensorFlow's C++ logging off stderr unless `verbose` or the user set its level (the
    setting reaches the processes this one starts through the environment)."""
    global _native_logs_shown
    _native_logs_shown = verbose or "TF_CPP_MIN_LOG_LEVEL" in os.environ
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "0" if verbose else "3")


def import_tensorflow() -> None:
    """Import TensorFlow; its native libraries' start-up lines (printed before any log level
    applies) are dropped, or shown once when native logs are wanted."""
    if "tensorflow" in sys.modules:
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile("w+b") as capture:
        os.dup2(capture.fileno(), 2)
        try:
            import tensorflow  # noqa: F401 - imported for its side effect: the runtime is loaded
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            sys.stderr.write(_native_lines_handled(capture.read().decode(errors="replace")))
            sys.stderr.flush()


def _native_lines_handled(text: str) -> str:
    """`text` without native log lines, or with each only once when they are wanted."""
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


def as_json(document: dict[str, Any]) -> str:
    """The document as strict JSON: a NaN or infinity (a diverged run's loss) becomes null."""

    def finite(value: Any) -> Any:
        if isinstance(value, float) and not math.isfinite(value):
            return None
        if isinstance(value, dict):
            return {key: finite(item) for key, item in value.items()}
        if isinstance(value, list | tuple):
            return [finite(item) for item in value]
        return value

    return json.dumps(finite(document), allow_nan=False)
