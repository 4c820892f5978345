"""One live process per sweep: a second start of the same sweep refuses, naming the first.

The lock is an `flock` on DATA_DIR/locks/sweep-<key>.lock, which the kernel releases when its
process ends however it ends (a crash or SIGKILL cannot leave it held). The holder writes who it
is into the file, so the refusal can name it. Per data folder: two machines that train the same
sweep into one tracking server from two data folders are not stopped.

The key (`sweep_key`) needs no MLflow, Prefect or TensorFlow: `towerbench sweep` takes the lock
before Prefect's temporary server starts, and the flow, in the same process, finds it held.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from towerbench.config.losses import code_digests, user_code
from towerbench.config.model_ref import provenance
from towerbench.config.sections import TrainConfig
from towerbench.core.errors import TowerbenchError

_HELD: set[Path] = set()  # the locks this process holds: taking one again is a no-op
# How long a refused start waits for a holder that took the lock an instant before it to write
# who it is (it writes right after taking it).
HOLDER_RECORD_SECONDS = 2.0


def config_key(config: TrainConfig) -> str:
    """A configuration's identity across versions: its values that differ from the defaults
    (a field added later, at its default, leaves the key unchanged)."""
    return json.dumps(config.model_dump(mode="json", exclude_defaults=True), sort_keys=True)


def sweep_parts(configs: list[TrainConfig], versions: dict[str, str]) -> dict[str, Any]:
    """What makes a sweep the same sweep, part by part (which part changed can then be named):
    its configurations, each dataset's data version and each user model file's digest (and
    each user loss file's)."""
    models = {c.model: provenance(c.model).get("model_digest", "") for c in configs}
    models |= {c.loss: user_code(c.model, c.loss).get("loss_digest", "") for c in configs}
    return {
        "configs": hashlib.sha256(
            json.dumps([config_key(c) for c in configs]).encode()
        ).hexdigest(),
        "data": versions,
        "models": {model: digest for model, digest in models.items() if digest},
    }


def sweep_key(configs: list[TrainConfig], data_versions: list[str], flow: str) -> str:
    """The same configurations on the same data from the same flow, and the same content of
    every model and loss file: the same sweep (editing one starts a new one)."""
    digests = sorted({d for c in configs for d in code_digests(c.model, c.loss)})
    identity = [flow, sorted(data_versions), [config_key(c) for c in configs]]
    payload = json.dumps(identity + [digests] if digests else identity)
    return hashlib.sha256(payload.encode()).hexdigest()


def lock_path(data_dir: Path, key: str) -> Path:
    return data_dir / "locks" / f"sweep-{key[:16]}.lock"


def _holder(handle: IO[str]) -> str:
    """Who holds the lock, as it wrote itself into the file. A holder that took it an instant
    ago (two starts at once) is given HOLDER_RECORD_SECONDS to write that."""
    deadline = time.monotonic() + HOLDER_RECORD_SECONDS
    while True:
        handle.seek(0)
        try:
            who = json.loads(handle.read() or "{}")
        except json.JSONDecodeError:  # being written
            who = {}
        if {"pid", "host", "started"} <= set(who):
            started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(who["started"]))
            return f"process {who['pid']} on {who['host']}, started {started}"
        if time.monotonic() >= deadline:
            return "another process, which has not said who it is"
        time.sleep(0.05)


@contextlib.contextmanager
def only_live_sweep(data_dir: Path, key: str) -> Iterator[None]:
    """Hold the sweep's lock while the block runs; refuse at once if another process holds it
    (this process holding it already: the block runs under that hold)."""
    path = lock_path(data_dir.resolve(), key)
    if path in _HELD:
        yield
        return
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
        _HELD.add(path)
        try:
            yield
        finally:
            _HELD.discard(path)


def what_changed(old: dict[str, Any] | None, new: dict[str, Any]) -> str:
    """What differs between two sweeps' parts (`sweep_parts`), in words."""
    if old is None:  # recorded before the parts were
        return "its configurations, data or model files changed"
    changes = [
        f"model file {model} changed"
        for model, digest in new["models"].items()
        if old["models"].get(model, digest) != digest
    ]
    changes += [
        f"data version of {dataset} changed ({old['data'][dataset]} -> {version})"
        for dataset, version in new["data"].items()
        if old["data"].get(dataset, version) != version
    ]
    if old["configs"] != new["configs"]:
        changes.append("its configurations changed")
    return "; ".join(changes) or "towerbench's version changed"
