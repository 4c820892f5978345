"""What one call of towerbench's Python functions starts, and its end when the call returns.

The call starts what the command line starts (the servers checked, the training processes' fork
server, Prefect's temporary server when no PREFECT_API_URL is set) and stops what it started when
it returns, raises or is interrupted (a notebook's stop button: the sweep marks its runs KILLED and
keeps their checkpoints, so the same call resumes). A notebook's kernel keeps nothing running.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from towerbench.api.progress import shown_while_running
from towerbench.config.params import Params
from towerbench.core.native_logs import quiet_native_logs
from towerbench.serve.startup import prepare_prefect
from towerbench.tasks.training.fork_server import stop_fork_server


def _logs_sent() -> None:
    """The flow runs' last log lines sent to the server before it stops. From a thread of its
    own: in a notebook this thread runs an event loop, where Prefect's drain is a coroutine."""
    from prefect.logging.handlers import APILogWorker

    drain = threading.Thread(target=APILogWorker.drain_all, kwargs={"timeout": 5})
    drain.start()
    drain.join()


@contextlib.contextmanager
def orchestrated(params: Params, verbose: bool) -> Iterator[None]:
    """Prefect and the fork server for the flows of one call, stopped at its end; what the call
    shows meanwhile (api/progress.py)."""
    quiet_native_logs(verbose)  # the training processes' TensorFlow logging
    server = None
    with shown_while_running(verbose):
        try:
            server = prepare_prefect(params)  # None: a URL is set, or an earlier call's still runs
            yield
        finally:
            if server is not None:
                _logs_sent()
                server.stop()
            stop_fork_server()
