"""A failed flow run's cause in one line: no traceback for a TowerbenchError, said once.

Prefect logs a flow's exception with its traceback ("Encountered exception during execution"),
then again from its engine ("Engine execution exited with unexpected exception"), to the terminal
and to the run's logs in the UI. A TowerbenchError already names the file or parameter and what
is wrong, so its traceback and the engine's repeat are noise; other exceptions keep both.
"""

from __future__ import annotations

import logging

from towerbench.core.errors import TowerbenchError

_ENGINE_REPEAT = "Engine execution exited with unexpected exception"
# Where Prefect's run loggers end: the run logs sent to the API, and the console on the root.
_LOGGERS = ("prefect.flow_runs", "prefect.task_runs", "")


class OneLineUserErrors(logging.Filter):
    """Drops the traceback of a TowerbenchError from a log record, and the engine's repeat."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if not isinstance(error, TowerbenchError):
            return True
        if record.getMessage() == _ENGINE_REPEAT:
            return False
        record.exc_info = None
        record.exc_text = None
        return True


def one_line_user_errors() -> None:
    """Put the filter on the handlers of Prefect's run loggers in this process (once)."""
    for name in _LOGGERS:
        for handler in logging.getLogger(name).handlers:
            if not any(isinstance(known, OneLineUserErrors) for known in handler.filters):
                handler.addFilter(OneLineUserErrors())
