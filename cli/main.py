"""The `towerbench` command: one subcommand per job, errors as one line and a non-zero exit.

Building the parser imports only the typed config: TensorFlow, Prefect and MLflow are imported by
a command after its options are validated, so `--help` and a bad option are answered at once.
"""

from __future__ import annotations

import argparse
import atexit
import importlib
import logging
import os
import signal
import sys

from towerbench.cli.console import (
    CommandResult,
    as_json,
    server_notices_hidden,
    stdout_reserved,
)
from towerbench.core.errors import TowerbenchError
from towerbench.core.native_logs import quiet_native_logs
from towerbench.core.reaper import temporary_files_of_this_process
from towerbench.model import cluster
from towerbench.serve.telemetry import telemetry_off_unless_opted_in
from towerbench.tasks.training.local_cluster import end_with_launcher

# Each module has `register(subparsers)`, adding its subcommands with a handler that returns an
# exit status, or a CommandResult when the command has `--json`.
COMMAND_MODULES = (
    "towerbench.cli.commands.data",
    "towerbench.cli.commands.train",
    "towerbench.cli.commands.orchestrate",
    "towerbench.cli.commands.advise",
    "towerbench.cli.commands.bench",
    "towerbench.cli.commands.team",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="towerbench",
        description="Does averaging tower gradients cost accuracy? Measure it on your devices.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    for command in subparsers.choices.values():
        command.add_argument(
            "--verbose",
            action="store_true",
            help="Show TensorFlow's C++ logging (absl, oneDNN, CUDA probing) on stderr; also "
            "shown when TF_CPP_MIN_LOG_LEVEL is set in the environment.",
        )
    return parser


RESUMABLE_COMMANDS = ("sweep", "pipeline", "advise")  # advise resumes its verification
# Commands that train, log artifacts through MLflow's temporary folders, or run until stopped: in
# their own process, their temporary files and their children's go in one folder that a watchdog
# removes however the command ends (SIGKILL included).
SCRATCH_FOLDER_COMMANDS = (*RESUMABLE_COMMANDS, "serve", "worker")
_FINAL_LINES: list[str] = []
_command_status: int | None = None  # set by `run`, in the command's own process
_own_process = False  # `run`: the command owns this process (not a call of `main` from Python)


def _at_exit() -> None:
    """Say the final lines. In the command's own process, then end it: every other exit handler
    has run, and the interpreter's teardown (freeing TensorFlow's, MLflow's and Prefect's objects
    one by one) would only add 3-6 s to every command and to a Ctrl-C."""
    for line in _FINAL_LINES:
        print(line, file=sys.stderr, flush=True)
    if _command_status is not None:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_command_status)


# Registered before anything else's exit handler, so it runs after them all.
atexit.register(_at_exit)


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def _run(args: argparse.Namespace) -> int:
    if not getattr(args, "json", False):
        outcome = args.handler(args)
        if not isinstance(outcome, CommandResult):
            return int(outcome or 0)
        result = outcome
    else:
        # Progress, logs and what started processes print go to stderr; the document alone to
        # stdout.
        with stdout_reserved() as stdout:
            result = args.handler(args)
        document = result.document
        if result.failure is not None:  # what it recorded, and why it failed
            document = {**document, "error": result.failure, "status": result.status}
        print(as_json(document), file=stdout, flush=True)
    if result.failure is not None:
        _say_error(args, result.failure)
    return result.status


def _failed(args: argparse.Namespace, message: str, status: int) -> int:
    """`status`, once `--json`'s stdout has the error document `{"error": ..., "status": ...}`."""
    if getattr(args, "json", False):
        print(as_json({"error": message, "status": status}), flush=True)
    return status


def _say_error(args: argparse.Namespace, message: str) -> None:
    """The command's one error line: last on stderr (for a resumable command, after Prefect's
    temporary server has logged its shutdown)."""
    line = f"towerbench {args.command}: error: {message}"
    if _own_process and args.command in RESUMABLE_COMMANDS:
        _FINAL_LINES.append(line)
    else:
        print(line, file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    end_with_launcher()  # a worker of `--workers N` ends with the command that started it
    # Offline by default: no usage reports from MLflow, Prefect or DVC (before they are imported).
    telemetry_off_unless_opted_in()
    args = build_parser().parse_args(argv)
    # TensorFlow's C++ logging would stand above the one line a user came for; Prefect's
    # server notices after it.
    quiet_native_logs(args.verbose)
    if not args.verbose:
        server_notices_hidden()
    args.argv = list(sys.argv[1:] if argv is None else argv)  # what `--workers N` starts N times
    if _own_process and args.command in SCRATCH_FOLDER_COMMANDS:
        temporary_files_of_this_process(f"towerbench-{args.command}-")
    signal.signal(signal.SIGTERM, _interrupt)  # a clean stop, as for Ctrl-C
    # Ctrl-C too, even when whatever started us left SIGINT ignored or blocked.
    signal.signal(signal.SIGINT, _interrupt)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    status = _run_reporting_errors(args)
    cluster.leave(status)  # a worker of a cluster exits here, once the others are done
    return status


def _run_reporting_errors(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except TowerbenchError as error:
        _say_error(args, str(error))
        # 2 for bad input; an infrastructure failure (a server lost) says 1 (a run failed).
        return _failed(args, str(error), getattr(error, "exit_status", 2))
    except BrokenPipeError:
        # Whoever read our output is gone (the launcher of `--workers N` killed, `| head`):
        # nothing to say, nor to flush at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except KeyboardInterrupt:
        if args.command in RESUMABLE_COMMANDS:
            # Said at exit, after Prefect's temporary server has logged its own shutdown.
            _FINAL_LINES.append(
                f"towerbench {args.command}: interrupted; run the same command again to resume"
            )
        else:
            print(f"towerbench {args.command}: interrupted", file=sys.stderr)
        return _failed(args, "interrupted", 130)


def run() -> None:
    """The `towerbench` command: `main()`, then exit once the exit handlers have run."""
    global _command_status, _own_process
    _own_process = True
    _command_status = main()
    sys.exit(_command_status)


if __name__ == "__main__":
    run()
