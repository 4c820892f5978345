"""A watchdog that ends process groups when the process that started it dies, however it dies.

`Reaper()` starts `python -m towerbench.core.reaper` in a session of its own, with a pipe from
its owner as stdin. The owner names each group to watch (`watch`: a child started with
`start_new_session=True` leads a group whose id is its pid) and each scratch folder to remove
(`remove`, unless `keep` takes it back). When the pipe closes (the owner exited, or was killed:
SIGKILL and a closed terminal included) the watchdog sends SIGTERM to every group, SIGKILL to what
is left after `GRACE_SECONDS`, then removes the folders, so servers and the workers they started
do not outlive their owner holding its ports, nor leave their files behind.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable

GRACE_SECONDS = 3.0


def _alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def end_groups(groups: list[int], grace_seconds: float = GRACE_SECONDS) -> None:
    """SIGTERM every group, then SIGKILL the ones still alive after `grace_seconds`."""
    for group in groups:
        if _alive(group):
            os.killpg(group, signal.SIGTERM)
    deadline = time.monotonic() + grace_seconds
    while time.monotonic() < deadline and any(_alive(group) for group in groups):
        time.sleep(0.1)
    for group in groups:
        if _alive(group):
            os.killpg(group, signal.SIGKILL)


class Reaper:
    """The owner's side: start the watchdog, name the groups, close it at a normal end."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "towerbench.core.reaper"],
            stdin=subprocess.PIPE,
            text=True,
            start_new_session=True,  # a terminal's Ctrl-C or hang-up does not reach it
        )

    def watch(self, process: subprocess.Popen) -> None:
        """End `process`'s group (it must lead one) with this process."""
        self._say(f"group {process.pid}")

    def _say(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()

    def remove(self, folder: str) -> None:
        """Remove `folder` once the watched groups have ended."""
        self._say(f"remove {folder}")

    def keep(self, folder: str) -> None:
        """Take back a `remove`: the owner wants the folder kept (it names it in an error)."""
        self._say(f"keep {folder}")

    def close(self) -> None:
        """The owner is ending: the watchdog ends what is still running, then exits."""
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(GRACE_SECONDS + 5)


_PROCESS_REAPERS: list[Reaper] = []  # live as long as the process: their pipes close at its end


def remove_when_this_process_ends(folder: str) -> None:
    """Have a watchdog (one per process) remove `folder` when this process ends, however it
    ends."""
    if not _PROCESS_REAPERS:
        _PROCESS_REAPERS.append(Reaper())
    _PROCESS_REAPERS[0].remove(folder)


def end_process_reapers(keep: Iterable[str] = ()) -> None:
    """End the process-wide watchdogs now, leaving the folders in `keep` in place: for a
    long-lived process (a notebook's kernel) between calls, whose own exit removes those."""
    while _PROCESS_REAPERS:
        reaper = _PROCESS_REAPERS.pop()
        for folder in keep:
            reaper.keep(folder)
        reaper.close()


def temporary_files_of_this_process(prefix: str) -> str:
    """Point this process's temporary files, and its children's (Prefect's folder per flow run,
    multiprocessing's), into one folder that a watchdog removes when the process ends, however it
    ends; its path."""
    while True:
        folder = os.path.join(tempfile.gettempdir(), prefix + secrets.token_hex(4))
        # Named to the watchdog before it exists: no moment when a kill would leave it behind.
        remove_when_this_process_ends(folder)
        try:
            os.mkdir(folder, 0o700)
            break
        except FileExistsError:  # another process's: not ours to remove
            _PROCESS_REAPERS[0].keep(folder)
    os.environ["TMPDIR"] = folder
    tempfile.tempdir = folder
    return folder


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    groups: list[int] = []
    folders: dict[str, None] = {}
    for line in sys.stdin:
        verb, _, argument = line.rstrip("\n").partition(" ")
        if verb == "group":
            groups.append(int(argument))
        elif verb == "remove":
            folders[argument] = None
        elif verb == "keep":
            folders.pop(argument, None)
    end_groups(groups)
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
