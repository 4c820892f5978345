"""A flow's results and verdicts, logged for the Prefect UI only.

The command prints them on stdout and a Python call after it returns, so on a terminal or in a
notebook each is shown once; the flow run's log in the UI still ends with them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from prefect import get_run_logger
from prefect.logging.handlers import APILogHandler

_UI_ONLY = logging.getLogger("towerbench.prefect_ui")


def log_for_the_ui(lines: Iterable[str]) -> None:
    """Each line in the current flow or task run's log, not on this process's console."""
    if not _UI_ONLY.handlers:
        _UI_ONLY.addHandler(APILogHandler())
        _UI_ONLY.setLevel(logging.INFO)
        _UI_ONLY.propagate = False  # the console handlers hang on the root logger
    context = getattr(get_run_logger(), "extra", None) or {}  # the run's ids, for the API
    run = logging.LoggerAdapter(_UI_ONLY, dict(context))
    for line in lines:
        run.info(line)
