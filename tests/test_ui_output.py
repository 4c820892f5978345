"""`towerbench ui`'s terminal: the servers' full output in log files, on the terminal only errors
(a traceback as one line), each warning once, and the served runs' own lines."""

from __future__ import annotations

import io
import subprocess
import sys
import textwrap

from towerbench.serve.process_output import OutputRelay

SERVER_OUTPUT = textwrap.dedent(
    """\
    2026/11/30 22:10:00 INFO:     Started server process [22789]
    2026/11/30 22:10:26 INFO:     127.0.0.1:37082 - "GET / HTTP/1.1" 200 OK
    WARNING: All log messages before absl::InitializeLog() is called are written to STDERR
    I0000 00:00:1796076587.789455   22838 cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU will not be used.
    /venv/lib/python3.11/site-packages/mlflow/server/fastapi_app.py:23: StarletteDeprecationWarning: starlette.middleware.wsgi is deprecated
      from starlette.middleware.wsgi import WSGIResponder, build_environ
    2026/11/30 22:12:01 ERROR mlflow.server: database is locked
    """  # noqa: E501 - real lines are long
)
RUN_OUTPUT = textwrap.dedent(
    """\
    I0000 00:00:1796076599.843621   22901 cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU will not be used.
    22:29:20.148 | INFO    | Flow run 'amigurumi-asp' - Beginning flow run 'amigurumi-asp' for flow 'pipeline'
    22:29:21.366 | ERROR   | Flow run 'amigurumi-asp' - Encountered exception during execution: TowerbenchError('params.yaml: fetch.name: ...')
    Traceback (most recent call last):
      File "/venv/lib/python3.11/site-packages/prefect/flow_engine.py", line 1300, in run_context
        yield self
    TypeError: inner

    The above exception was the direct cause of the following exception:

    Traceback (most recent call last):
      File "/work/tasks/data/dvc_stages.py", line 88, in _check_matches_params
        raise TowerbenchError(
    towerbench.core.errors.TowerbenchError: params.yaml: fetch.name: 'digits-copy' in the form, 'digits' in params.yaml
    22:29:21.710 | INFO    | Flow run 'amigurumi-asp' - Finished in state Failed('...')
    """  # noqa: E501
)


def relay_of(output: str, name: str, relay: OutputRelay, everything: bool) -> None:
    """A real child process writing `output`, followed by `relay` until it exits."""
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdout.write(sys.stdin.read())"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    relay.follow(name, child.stdout, everything=everything)
    child.stdin.write(output)
    child.stdin.close()
    child.wait()


def test_the_terminal_gets_errors_warnings_once_and_the_runs_lines(tmp_path) -> None:
    terminal = io.StringIO()
    relay = OutputRelay(tmp_path, terminal)
    relay_of(SERVER_OUTPUT, "mlflow-ui", relay, everything=False)
    relay.finish()
    relay_of(RUN_OUTPUT, "serve", relay, everything=True)
    relay.finish()

    assert (tmp_path / "mlflow-ui.log").read_text() == SERVER_OUTPUT
    assert (tmp_path / "serve.log").read_text() == RUN_OUTPUT
    shown = terminal.getvalue().splitlines()
    assert shown == [
        # The server: its first CUDA notice and its error; no access log, no library chatter.
        SERVER_OUTPUT.splitlines()[3],
        "2026/11/30 22:12:01 ERROR mlflow.server: database is locked",
        # The run: the same CUDA notice again is left out, the tracebacks are their last line.
        RUN_OUTPUT.splitlines()[1],
        RUN_OUTPUT.splitlines()[2],
        "TypeError: inner  (traceback in {})".format(tmp_path / "serve.log"),
        "towerbench.core.errors.TowerbenchError: params.yaml: fetch.name: 'digits-copy' in the "
        "form, 'digits' in params.yaml  (traceback in {})".format(tmp_path / "serve.log"),
        RUN_OUTPUT.splitlines()[-1],
    ]
