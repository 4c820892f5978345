"""A run's checkpoint folder, from which a killed run resumes exactly.

It holds the TensorFlow checkpoints `ckpt-<step>` (the latest two), `history.json` (the epoch
records so far) and `train_config.json` (the settings a run must share to resume from them: all
but `epochs` and `checkpoint_every`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import tensorflow as tf

from towerbench.config.sections import TrainConfig
from towerbench.core.errors import TowerbenchError
from towerbench.core.files import write_atomically
from towerbench.model.records import EpochRecord

if TYPE_CHECKING:
    from towerbench.model.towers import TowerTrainer

CONFIG_FILE = "train_config.json"
HISTORY_FILE = "history.json"
KEPT_CHECKPOINTS = 2
# Settings a resumed run may change: running longer, checkpointing more or less often, waiting
# longer for a stuck worker.
RESUMABLE_CHANGES = {"epochs", "checkpoint_every", "collective_timeout", "metric"}
# `training_state`'s parts, by their names in the checkpoint (the last two only where they apply).
STATE_NAMES = (
    "weights",
    "optimizer",
    "ema",
    "noise",
    "metric_sums",
    "lr_sums",
    "loss_scale",
    "adascale",
)


def training_state(trainer: TowerTrainer) -> tf.train.Checkpoint:
    """Everything a resumed run needs besides the data order (a pure function of the step): the
    weights, the optimizer state with its step counter, the weight EMA, the noise-scale averages
    and the running epoch's metric sums; float16's loss scale; AdaScale's averages and tau. The
    names are the checkpoint format."""
    return tf.train.Checkpoint(
        weights=[variable.value for variable in trainer.model.variables],
        optimizer=[variable.value for variable in trainer.optimizer.variables],
        **trainer.saved_state(),
    )


def state_variables(state: tf.train.Checkpoint) -> list:
    """The variables of `training_state`, in a fixed order (what workers broadcast)."""
    return [
        *state.weights,
        *state.optimizer,
        *state.ema,
        *state.noise.variables,
        *state.metric_sums,
        *state.lr_sums,
        *(state.loss_scale.variables if hasattr(state, "loss_scale") else ()),
        *(state.adascale.variables if hasattr(state, "adascale") else ()),
    ]


def _restore(state: tf.train.Checkpoint, path: str) -> None:
    """`state` from the checkpoint at `path`, every object matched; a checkpoint written before
    the epoch's LR sums were kept restores the rest, and those restart at 0."""
    if not any(name.startswith("lr_sums/") for name, _ in tf.train.list_variables(path)):
        kept = {name: getattr(state, name) for name in STATE_NAMES if hasattr(state, name)}
        del kept["lr_sums"]
        state = tf.train.Checkpoint(**kept)
    state.restore(path).assert_existing_objects_matched()


def _write_json_atomically(path: Path, payload: Any) -> None:
    write_atomically(path, json.dumps(payload, indent=2).encode())


class Checkpoints:
    """Saves a run's state with its history; `open` restores the latest save."""

    def __init__(self, manager: tf.train.CheckpointManager, every: int):
        self.manager = manager
        self.every = every
        self.folder = Path(manager.directory)

    @classmethod
    def open(
        cls, folder: Path, config: TrainConfig, state: tf.train.Checkpoint
    ) -> tuple[Checkpoints, list[EpochRecord]]:
        """Checkpoints in `folder`, with `state` restored and the history up to the restored step
        if the folder holds a run of the same settings (an empty history if it holds none)."""
        folder.mkdir(parents=True, exist_ok=True)
        wanted = config.model_dump(mode="json", exclude=RESUMABLE_CHANGES)
        manager = tf.train.CheckpointManager(state, str(folder), max_to_keep=KEPT_CHECKPOINTS)
        checkpoints = cls(manager, config.checkpoint_every)
        if not manager.latest_checkpoint:
            _write_json_atomically(folder / CONFIG_FILE, wanted)
            return checkpoints, []
        checkpoints._check_settings(wanted)
        _restore(state, manager.latest_checkpoint)
        step = int(manager.latest_checkpoint.rsplit("-", 1)[-1])
        return checkpoints, checkpoints._history_until(step)

    def _check_settings(self, wanted: dict[str, Any]) -> None:
        path = self.folder / CONFIG_FILE
        saved = json.loads(path.read_text()) if path.is_file() else {}
        # A setting added since the folder was written had its default value then.
        defaults = TrainConfig.model_construct().model_dump(mode="json")
        different = sorted(
            name for name in wanted if saved.get(name, defaults.get(name)) != wanted[name]
        )
        if different:
            raise TowerbenchError(
                f"--checkpoint-dir {self.folder}: holds a run with different settings "
                f"({', '.join(different)}); use another folder to start a new run"
            )

    def _history_until(self, step: int) -> list[EpochRecord]:
        path = self.folder / HISTORY_FILE
        if not path.is_file():
            return []
        entries = json.loads(path.read_text())
        return [EpochRecord.from_dict(entry) for entry in entries if entry["step"] <= step]

    def due(self, step: int) -> bool:
        """Whether `--checkpoint-every` asks for a save after `step`."""
        return self.every > 0 and step % self.every == 0

    def save(self, step: int, history: list[EpochRecord]) -> None:
        # History first: an entry beyond the checkpoint's step is ignored when resuming.
        _write_json_atomically(self.folder / HISTORY_FILE, [record.to_dict() for record in history])
        self.manager.save(checkpoint_number=step)
