"""One live process per sweep: a second start of the same sweep refuses, naming the first.

The lock is an `flock` on DATA_DIR/locks/sweep-<key>.lock, which the kernel releases when its
process ends however it ends (a crash or SIGKILL cannot leave it held). The holder writes who it
is into the file, so the refusal can name it. Per data folder: two machines that train the same
sweep into one tracking server from two data folders are not stopped.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

from towerbench.core.errors import TowerbenchError


def lock_path(data_dir: Path, key: str) -> Path:
    return data_dir / "locks" / f"sweep-{key[:16]}.lock"


def _holder(handle) -> str:
    handle.seek(0)
    try:
        who = json.loads(handle.read() or "{}")
    except json.JSONDecodeError:
        return "another process"
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(who.get("started", 0)))
    return f"process {who.get('pid', '?')} on {who.get('host', '?')}, started {started}"


@contextlib.contextmanager
def only_live_sweep(data_dir: Path, key: str) -> Iterator[None]:
    """Hold the sweep's lock while the block runs; refuse at once if another process holds it."""
    path = lock_path(data_dir, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise TowerbenchError(
                f"the same sweep is already running ({_holder(handle)}): wait for it to end, "
                "or stop it and run this command again to resume it"
            ) from None
        handle.seek(0)
        handle.truncate()
        who = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}
        handle.write(json.dumps(who))
        handle.flush()
        yield
