"""Prefect's temporary API server, made one of ours.

Without PREFECT_API_URL Prefect starts a temporary server in a child process. Left alone, a
terminal's Ctrl-C kills it before our own clean-up can use it, and a SIGKILL of ours leaves it
orphaned and listening. Started here instead, it runs in its own session (Ctrl-C reaches only
us; it is stopped at exit) and the kernel ends it when its parent dies (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import ctypes
import functools
import signal
import subprocess
import types
from typing import TYPE_CHECKING
from unittest import mock

from towerbench.core.errors import TowerbenchError
from towerbench.core.processes import stop
from towerbench.tasks.preflight import prefect_api_url

if TYPE_CHECKING:
    from prefect.server.api.server import SubprocessASGIServer

PR_SET_PDEATHSIG = 1  # linux/prctl.h
STOP_GRACE_SECONDS = 2


def _end_with_parent() -> None:
    """In the child, before exec: SIGTERM when the thread that started it ends."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def start_owned_temporary_server(timeout_seconds: int) -> SubprocessASGIServer | None:
    """Start the temporary server now, from this (main) thread, unless an API URL is set (in the
    environment or the Prefect profile); the server when this call started it (its `stop()` ends
    it), else None.

    PR_SET_PDEATHSIG follows the thread that forked the child, so the server must be started
    from the main thread; every later Prefect client reuses this one instance. One that fails to
    start (a timeout, Ctrl-C) is stopped at once.
    """
    if prefect_api_url():
        return None
    from prefect.server.api import server as prefect_server

    class OwnedServer(prefect_server.SubprocessASGIServer):
        def _run_uvicorn_command(self) -> subprocess.Popen:
            popen = functools.partial(
                subprocess.Popen, start_new_session=True, preexec_fn=_end_with_parent
            )
            stand_in = types.SimpleNamespace(Popen=popen)
            with mock.patch.object(prefect_server, "subprocess", stand_in):
                return super()._run_uvicorn_command()

        def stop(self) -> None:
            # Stopped at our exit, when nothing waits on its answers any more: 2 s to shut down
            # (Prefect waits 5), then killed, so Ctrl-C ends the command within seconds.
            if self.server_process is not None:
                stop([self.server_process], STOP_GRACE_SECONDS)
            super().stop()

    server = OwnedServer()  # Prefect's default server: an earlier call's while it runs
    if server.running:
        return None
    try:
        server.start(timeout=timeout_seconds)
    except RuntimeError as error:  # Prefect's "Timed out while attempting to connect ..."
        server.stop()
        said = str(error).splitlines()[0][:300]
        raise TowerbenchError(
            f"Prefect's temporary API server did not answer within {timeout_seconds} s "
            f"({said}); a busy machine may need longer "
            "(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS), or set PREFECT_API_URL to a "
            "running Prefect server (`prefect server start`)"
        ) from None
    except BaseException:
        server.stop()
        raise
    return server
