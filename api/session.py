"""What one call of towerbench's Python functions starts, and its end when the call returns.

The call starts what the command line starts (the servers checked, the training processes' fork
server, Prefect's temporary server when no PREFECT_API_URL is set) and stops what it started when
it returns, raises or is interrupted (a notebook's stop button: the sweep marks its runs KILLED and
keeps their checkpoints, so the same call resumes). A notebook's kernel keeps nothing running.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from towerbench.api.progress import progress_bars
from towerbench.config.params import Params
from towerbench.serve.startup import prepare_prefect
from towerbench.tasks.training.fork_server import stop_fork_server


def _logs_sent() -> None:
    """The flow runs' last log lines sent to the server before it stops."""
    from prefect.logging.handlers import APILogWorker

    APILogWorker.drain_all(timeout=5)


@contextlib.contextmanager
def orchestrated(params: Params) -> Iterator[None]:
    """Prefect and the fork server for the flows of one call, stopped at its end, and the
    configurations' progress bars in Jupyter."""
    server = None
    try:
        server = prepare_prefect(params)  # None: a URL is set, or an earlier call's still runs
        with progress_bars():
            yield
    finally:
        if server is not None:
            _logs_sent()
            server.stop()
        stop_fork_server()
