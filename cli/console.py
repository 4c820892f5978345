"""What the CLI writes where: under `--json` stdout carries the result document and nothing else
(TensorFlow's C++ logging is core/native_logs.py's)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
from collections.abc import Iterator
from typing import Any, NamedTuple, TextIO


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
