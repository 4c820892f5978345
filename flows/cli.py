"""The `towerbench` command: one subcommand per job, errors as one line and a non-zero exit."""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys

from flows.telemetry import telemetry_off_unless_opted_in
from model.errors import TowerbenchError

# Each module has `register(subparsers)`, adding its subcommands with a `handler(args) -> int`.
COMMAND_MODULES = (
    "flows.commands.data",
    "flows.commands.train",
    "flows.commands.orchestrate",
    "flows.commands.bench",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="towerbench",
        description="Does averaging tower gradients cost accuracy? Measure it on your devices.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    return parser


RESUMABLE_COMMANDS = ("sweep", "pipeline")


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    # TensorFlow's C++ start-up chatter hides the output users came for.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # Offline by default: no usage reports from MLflow, Prefect or DVC (before they are imported).
    telemetry_off_unless_opted_in()
    args = build_parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)  # a clean stop, as for Ctrl-C
    try:
        return int(args.handler(args) or 0)
    except TowerbenchError as error:
        print(f"towerbench {args.command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        resume = (
            "; run the same command again to resume"
            if args.command in RESUMABLE_COMMANDS
            else ""
        )
        print(f"towerbench {args.command}: interrupted{resume}", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
