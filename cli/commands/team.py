"""Subcommands for a team's machines: `worker` (a host's devices serving a sweep's work pool) and
`tracking serve` (the shared MLflow server)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from towerbench.core.errors import TowerbenchError


def _devices(text: str) -> str:
    if not re.fullmatch(r"\d+(,\d+)*", text):
        raise argparse.ArgumentTypeError(f"{text!r}: give device indices like 0,1")
    return text


def run_worker_command(args: argparse.Namespace) -> int:
    if not args.project.is_dir():
        raise TowerbenchError(f"--project {args.project}: no such folder")
    from towerbench.serve.pool_worker import run_worker

    run_worker(args.pool, args.devices, args.limit, args.project)
    return 0


def run_tracking_serve_command(args: argparse.Namespace) -> int:
    from towerbench.serve.tracking_server import serve_tracking, server_command

    return serve_tracking(
        server_command(
            args.backend_store_uri,
            args.artifacts_destination,
            args.host,
            args.port,
            args.workers,
            args.allowed_hosts,
            args.basic_auth,
        )
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add this module's subcommands."""
    worker = subparsers.add_parser(
        "worker",
        help="Train the configurations of `sweep --pool NAME` on this host's devices.",
        description="A Prefect process worker (needs PREFECT_API_URL). Two workers on one host "
        "can split its GPUs: --devices 0,1,2,3 and --devices 4,5,6,7.",
    )
    worker.add_argument("--pool", required=True, help="Prefect work pool (created if missing).")
    worker.add_argument(
        "--devices", type=_devices, help="GPU indices this worker owns (default: all)."
    )
    worker.add_argument(
        "--limit", type=int, default=1, help="Configurations trained at once (default 1)."
    )
    worker.add_argument(
        "--project",
        type=Path,
        default=Path.cwd(),
        help="This host's towerbench checkout: its data folder and dvc.lock (default: here).",
    )
    worker.set_defaults(handler=run_worker_command)

    tracking = subparsers.add_parser("tracking", help="The team's MLflow tracking server.")
    actions = tracking.add_subparsers(dest="action", required=True, metavar="ACTION")
    serve = actions.add_parser(
        "serve",
        help="Run `mlflow server` for a team: runs in a database, artifacts proxied.",
        description="Workers and sweeps then use --tracking-uri http://HOST:PORT.",
    )
    serve.add_argument(
        "--backend-store-uri",
        required=True,
        help="Where runs are stored, e.g. postgresql://USER:PASSWORD@DBHOST:5432/mlflow.",
    )
    serve.add_argument(
        "--artifacts-destination",
        required=True,
        help="Where artifacts go (a folder on this host or s3://bucket/path); clients upload "
        "through the server.",
    )
    serve.add_argument(
        "--host", default="127.0.0.1", help="Address to bind (0.0.0.0: every interface)."
    )
    serve.add_argument("--port", type=int, default=5000)
    serve.add_argument("--workers", type=int, default=2, help="Server processes (default 2).")
    serve.add_argument(
        "--allowed-hosts",
        help="Host names (with :PORT) clients use, comma-separated; MLflow answers 403 to "
        "other names (default: localhost and private addresses).",
    )
    serve.add_argument(
        "--basic-auth",
        action="store_true",
        help="Users and passwords (mlflow[auth]); needs MLFLOW_FLASK_SERVER_SECRET_KEY and "
        "MLFLOW_AUTH_ADMIN_PASSWORD in the environment.",
    )
    serve.set_defaults(handler=run_tracking_serve_command)
