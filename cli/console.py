"""What the CLI writes where: under `--json` stdout carries the result document and nothing else;
a command's results come last, after Prefect's run logs (its progress) and without Prefect's
temporary-server notices (TensorFlow's C++ logging is core/native_logs.py's)."""

from __future__ import annotations

import contextlib
import json
import logging
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


class _NoServerNotices(logging.Filter):
    """Prefect's own notices below a warning ("Starting/Stopping temporary server on ..."),
    logged to the `prefect` logger itself; the runs' logs have loggers of their own."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING


def server_notices_hidden() -> None:
    """Keep Prefect's temporary-server notices off stderr (kept when Prefect sets up logging)."""
    logging.getLogger("prefect").addFilter(_NoServerNotices())


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
