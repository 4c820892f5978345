"""A cluster of worker processes on this machine (`--workers N` without `TF_CONFIG`).

Each worker is the same command with its own `TF_CONFIG` (ports on 127.0.0.1). The chief's stdout
goes to a callback line by line; the other workers' stdout is discarded (they compute the same
numbers). When one worker fails the others are stopped at once rather than left to time out, and
every worker ends with the caller: on an exception here (Ctrl-C, SIGTERM), or, when the calling
process dies, through `end_with_launcher`, which each worker calls first thing.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from towerbench.core.processes import stop
from towerbench.model.cluster import TF_CONFIG, local_tf_configs

LAUNCHER_PID = "TOWERBENCH_LAUNCHER_PID"
# How long a stopped worker has to exit (the chief marks its MLflow run) before it is killed.
STOP_GRACE_SECONDS = 3
_POLL_SECONDS = 0.2
SETTLE_SECONDS = 1.0  # from a first failure until the workers that failed with it are collected
# After one worker fails, how long the others get to fail on their own (a collective notices a
# dead peer at once, the coordination service's heartbeat within about 10 s) before being stopped.
FAILURE_GRACE_SECONDS = 15


# A line that states a failure: `error: ...` or `towerbench train: error: ...`.
_ERROR_LINE = re.compile(r"^(?:towerbench \S+: )?error: (.*)$")


def last_error(log_text: str) -> str | None:
    """The message of a process's last `error:` line (its one-line cause), if it printed one."""
    errors = [
        match.group(1)
        for line in log_text.splitlines()
        if (match := _ERROR_LINE.match(line.strip()))
    ]
    return errors[-1] if errors else None


@dataclass(frozen=True)
class ClusterOutcome:
    """How each worker ended (chief first), what each wrote to stderr when it was captured, and
    which worker failed first (the others were stopped because of it)."""

    returncodes: list[int]
    stderr: list[str]
    first_failure: int | None

    @property
    def status(self) -> int:
        """0 if every worker succeeded; else the first failing worker's exit code, or 1 when it
        was lost (killed by a signal): the run failed, its input was fine."""
        if self.first_failure is None:
            return 0
        return max(self.returncodes[self.first_failure], 1)

    def failures(self) -> list[str]:
        """Why the run failed: the first failing worker's last error line (or how it ended)."""
        if self.first_failure is None:
            return []
        index = self.first_failure
        code = self.returncodes[index]
        ended = f"killed by signal {-code}" if code < 0 else f"exited with code {code}"
        stopped = " (the other workers were stopped)" if len(self.returncodes) > 1 else ""
        return [f"worker {index}: {last_error(self.stderr[index]) or ended}{stopped}"]


def free_ports(count: int) -> list[int]:
    """`count` TCP ports free on 127.0.0.1 right now."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def end_with_launcher() -> None:
    """In a worker started here: receive SIGTERM when the launcher dies (Linux), or exit now if
    it is already gone. A no-op in any other process."""
    launcher = os.environ.get(LAUNCHER_PID)
    if launcher is None:
        return
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
    if os.getppid() != int(launcher):
        os._exit(143)


def _cause_first(codes: list[int | None]) -> list[int]:
    """The workers that failed, one killed by a signal first: it caused the others' collective
    errors (seen together, the order of their exits says nothing)."""
    ended = {index: code for index, code in enumerate(codes) if code}
    return sorted(ended, key=lambda index: ended[index] > 0)


def _stop_chief_first(processes: list[subprocess.Popen]) -> None:
    """SIGTERM the chief (it marks its run), SIGKILL the other workers (they hold nothing of
    their own); SIGKILL what is left after the grace period."""
    stop(processes, STOP_GRACE_SECONDS, ask=[index == 0 for index in range(len(processes))])


def _stop_all_when_one_fails(
    processes: list[subprocess.Popen], done: threading.Event, failed: list[int]
) -> None:
    """Poll the workers; at the first failure, note which one, give the others
    `FAILURE_GRACE_SECONDS` to notice and say so themselves, then stop them."""
    while not done.is_set():
        if any(process.poll() not in (None, 0) for process in processes):
            # A killed worker can take longer to be reaped than the others take to notice and
            # exit: after a moment, one killed by a signal is taken as the cause.
            time.sleep(SETTLE_SECONDS)
            failed.extend(_cause_first([process.poll() for process in processes]))
        if failed:
            deadline = time.monotonic() + FAILURE_GRACE_SECONDS
            while time.monotonic() < deadline and any(p.poll() is None for p in processes):
                time.sleep(_POLL_SECONDS)
            _stop_chief_first(processes)
            return
        time.sleep(_POLL_SECONDS)


def run_local_cluster(
    command: list[str],
    workers: int,
    on_chief_line: Callable[[str], None],
    stdin_text: str | None = None,
    environment: dict[str, str] | None = None,
    capture_chief_stderr: bool = False,
) -> ClusterOutcome:
    """Run `workers` copies of `command` as one cluster and wait for all of them."""
    base = dict(environment or os.environ)
    configs = local_tf_configs(free_ports(workers))
    with contextlib.ExitStack() as stack:
        logs = [stack.enter_context(tempfile.TemporaryFile("w+")) for _ in range(workers)]
        processes: list[subprocess.Popen] = []
        done = threading.Event()
        failed: list[int] = []
        try:
            for index, config in enumerate(configs):
                chief = index == 0
                processes.append(
                    subprocess.Popen(
                        command,
                        stdin=subprocess.PIPE if stdin_text is not None else subprocess.DEVNULL,
                        stdout=subprocess.PIPE if chief else subprocess.DEVNULL,
                        stderr=logs[index] if capture_chief_stderr or not chief else None,
                        text=True,
                        env={**base, TF_CONFIG: config, LAUNCHER_PID: str(os.getpid())},
                        start_new_session=True,  # a terminal's Ctrl-C reaches the launcher only
                    )
                )
                if stdin_text is not None:
                    assert processes[-1].stdin is not None
                    processes[-1].stdin.write(stdin_text)
                    processes[-1].stdin.close()
            watcher = threading.Thread(
                target=_stop_all_when_one_fails, args=(processes, done, failed), daemon=True
            )
            watcher.start()
            assert processes[0].stdout is not None
            for line in processes[0].stdout:
                on_chief_line(line)
            for process in processes:
                process.wait()
            done.set()
            watcher.join()
        except BaseException:
            _stop_chief_first(processes)
            raise
        finally:
            done.set()
        texts = []
        for index, log in enumerate(logs):
            log.seek(0)
            texts.append(log.read() if capture_chief_stderr or index else "")
    codes = [process.returncode for process in processes]
    if not failed:  # ended before the watcher looked
        failed = _cause_first(codes)
    return ClusterOutcome(codes, texts, failed[0] if failed else None)
