"""Workers: one training run over several processes or hosts, joined by TensorFlow's collectives.

Each worker runs the same tower step on its own devices and its slice of every global batch; one
all-reduce per step (`sum_over_workers`) adds the workers' combined gradients, BatchNorm statistics
and metric sums, so every worker applies the same update and the weights stay identical.
`tf.distribute.MultiWorkerMirroredStrategy` is created only to bring the cluster up (gRPC server,
coordination service with heartbeats, collective executor); its variables and `strategy.run` are
not used, so checkpoints hold plain variables and the chief saves them alone.

The cluster comes from `TF_CONFIG` ({"cluster": {"worker": [host:port, ...]}, "task": {"type":
"worker", "index": i}}); worker 0 is the chief. This module imports TensorFlow only when a
cluster is joined.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from dataclasses import dataclass

from towerbench.core.errors import TowerbenchError

TF_CONFIG = "TF_CONFIG"
# Far from the keys tf.distribute assigns (which start at 1), one per kind of collective.
_GROUP_KEY = 1_000_000
STEP_INSTANCE_KEY = 1
BROADCAST_INSTANCE_KEY = 2
GATHER_INSTANCE_KEY = 3
_BARRIER_MILLISECONDS = 1_800_000  # the chief may still be logging to MLflow
# The coordination service runs in the chief: after the last barrier it stays this long, so the
# others get their barrier replies before it exits (without it a peer's reply was lost once).
_LEADER_GRACE_SECONDS = 2.0


# The line of a collective's error message that says what happened to the other worker.
_TELLING = re.compile(r"refused|unhealthy|heartbeat|timed out|reset by peer|crashed", re.I)


@dataclass(frozen=True)
class Cluster:
    """Who takes part in a run and which of them this process is."""

    addresses: tuple[str, ...] = ()
    index: int = 0
    timeout_seconds: float | None = None  # a collective waiting longer than this fails

    @property
    def workers(self) -> int:
        return max(len(self.addresses), 1)

    @property
    def is_chief(self) -> bool:
        return self.index == 0

    @classmethod
    def from_environment(cls, timeout_seconds: float | None = None) -> Cluster:
        """The cluster in `TF_CONFIG`, or a single worker when it is unset."""
        text = os.environ.get(TF_CONFIG, "").strip()
        if not text:
            return cls(timeout_seconds=timeout_seconds)
        try:
            spec = json.loads(text)
            addresses = tuple(str(address) for address in spec["cluster"]["worker"])
            task = spec["task"]
            index = int(task["index"])
        except (ValueError, KeyError, TypeError) as error:
            raise TowerbenchError(
                f"{TF_CONFIG}: expected {{'cluster': {{'worker': [host:port, ...]}}, 'task': "
                f"{{'type': 'worker', 'index': i}}}} ({type(error).__name__}: {error})"
            ) from None
        if set(spec["cluster"]) != {"worker"} or task.get("type") != "worker":
            raise TowerbenchError(f"{TF_CONFIG}: only 'worker' tasks are supported (no chief/ps)")
        if not 0 <= index < len(addresses):
            raise TowerbenchError(
                f"{TF_CONFIG}: task index {index} is not one of the {len(addresses)} workers"
            )
        return cls(addresses, index, timeout_seconds)


def local_tf_configs(ports: list[int]) -> list[str]:
    """TF_CONFIG of each worker of a cluster on 127.0.0.1 at `ports`."""
    workers = [f"127.0.0.1:{port}" for port in ports]
    return [
        json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}})
        for index in range(len(ports))
    ]


_joined: Cluster | None = None


def join(cluster: Cluster) -> None:
    """Start this worker's part of the cluster (after the devices are split, before any op)."""
    global _joined
    if cluster.workers == 1 or _joined == cluster:
        return
    import tensorflow as tf

    options = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING,
        timeout_seconds=cluster.timeout_seconds,
    )
    try:
        tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    except tf.errors.OpError as error:
        address = cluster.addresses[cluster.index]
        raise TowerbenchError(
            f"{TF_CONFIG}: worker {cluster.index} could not start its server on {address} "
            f"({error.message.strip()}; is the port in use?)"
        ) from None
    _joined = cluster


def sum_over_workers(tensors: list, cluster: Cluster, instance_key: int, wire_dtype=None) -> list:
    """Each tensor summed over the workers, in one all-reduce (every worker calls this in step).
    Sent as `wire_dtype` (default float32), returned in each tensor's own dtype."""
    import tensorflow as tf

    values = [tf.convert_to_tensor(tensor) for tensor in tensors]
    wire = wire_dtype or tf.float32
    flat = tf.concat([tf.reshape(tf.cast(value, wire), [-1]) for value in values], 0)
    total = tf.raw_ops.CollectiveReduceV2(
        input=flat,
        group_size=cluster.workers,
        group_key=_GROUP_KEY,
        instance_key=instance_key,
        ordering_token=[],
        merge_op="Add",
        final_op="Id",
        communication_hint="ring",
        timeout_seconds=cluster.timeout_seconds or 0.0,
    )
    pieces = tf.split(total, [value.shape.num_elements() for value in values])
    return [
        tf.cast(tf.reshape(piece, value.shape), value.dtype)
        for value, piece in zip(values, pieces, strict=True)
    ]


def broadcast_from_chief(variables: list, cluster: Cluster, device: str) -> None:
    """Give every worker the chief's values of `variables` (exactly: sent as float64)."""
    if cluster.workers == 1:
        return
    import tensorflow as tf

    with tf.device(device):
        values = [tf.convert_to_tensor(variable) for variable in variables]
        sent = values if cluster.is_chief else [tf.zeros_like(value) for value in values]
        received = sum_over_workers(sent, cluster, BROADCAST_INSTANCE_KEY, tf.float64)
        for variable, value in zip(variables, received, strict=True):
            variable.assign(value)


def collective_failure(error: Exception, cluster: Cluster) -> TowerbenchError | None:
    """The one-line error for a TensorFlow error that means another worker is gone or stuck
    (None for any other error, or for a single worker)."""
    import tensorflow as tf

    if cluster.workers == 1 or not isinstance(error, tf.errors.OpError):
        return None
    if isinstance(error, tf.errors.DeadlineExceededError):
        reason = (
            "a worker took no part in a step for --collective-timeout "
            f"{cluster.timeout_seconds:g} s (stuck or far slower)"
        )
    else:
        reason = "another worker stopped or became unreachable"
    lines = [line.strip() for line in error.message.splitlines() if line.strip()]
    telling = [line for line in lines if _TELLING.search(line)]
    detail = (telling or lines or [""])[0]
    return TowerbenchError(
        f"worker {cluster.index} of {cluster.workers}: {reason} ({type(error).__name__}: "
        f"{detail[:300]}); start every worker again to resume from the last checkpoint"
    )


def leave(status: int) -> None:
    """End a joined worker: wait for the others (on success), then exit at once.

    TensorFlow's own exit waits on the coordination service for seconds to minutes; a collective
    as the last step can reset a peer's pending transfer, the coordination barrier cannot, as long
    as the chief (which hosts the service) outlives the others' replies. A failing worker exits
    without waiting, so the others fail fast on its missing heartbeat.
    """
    if _joined is None:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    if status == 0:
        from tensorflow.python.eager import context

        try:
            context.context().wait_at_barrier("towerbench_end", _BARRIER_MILLISECONDS)
        except Exception as error:  # noqa: BLE001 - a peer died after training: say so, exit
            print(f"error: the other workers did not finish: {error}", file=sys.stderr)
            status = 1
        if status == 0 and _joined.is_chief:
            time.sleep(_LEADER_GRACE_SECONDS)
    sys.stderr.flush()
    os._exit(status)
