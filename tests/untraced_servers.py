"""Read at the start of each Python process of a test session (conftest.py's `.pth` file):
in a third-party server, which runs none of towerbench's code, stop the coverage measurement
coverage.py's subprocess patch started. Measured, it doubled a Prefect server's CPU time (14 s
to 25 s in one pipeline test; 27 such servers in a `make test`) and measured nothing."""

import sys


def third_party_server(argv: list[str]) -> bool:
    """Prefect's server (temporary or `prefect server start`), or MLflow's (`mlflow server`,
    `mlflow ui` and the uvicorn workers they start)."""
    command = " ".join(argv)
    script = argv[1].rsplit("/", 1)[-1] if len(argv) > 1 else ""
    return (
        "prefect.server.api.server:create_app" in command
        or (script == "prefect" and argv[2:4] == ["server", "start"])
        or (script == "mlflow" and argv[2:3] in (["server"], ["ui"]))
        or ("-m uvicorn" in command and "mlflow" in command)
    )


if "coverage" in sys.modules and third_party_server(sys.orig_argv):
    import coverage

    measuring = coverage.Coverage.current()
    if measuring is not None:
        measuring.stop()
