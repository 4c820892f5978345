"""The training loop: data -> tower steps -> honest metrics, evaluation and checkpoints.

Metrics per epoch: cross-entropy averaged over ALL towers' examples (not the last tower's), the
weight-decay term separately and their sum; train accuracy; test accuracy of the raw weights and
of their exponential moving average (the tutorial's, decay 0.9999); images/s; step time; LR; and
for k >= 2 towers the gradient noise scale. Evaluation sees every test example exactly once.

Resuming: checkpoints hold the weights, optimizer state (with its step counter), the weight EMA,
the noise-scale averages and the epoch's metric sums. The data order and distortions are pure
functions of (seed, epoch, position) (see input_pipeline), and nothing else draws random numbers
after initialisation, so a run resumed from step s replays exactly the steps an uninterrupted run
takes from s: same final weights.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from model.config import TrainConfig
from model.devices import TowerDevices, configure_tower_devices
from model.errors import TowerbenchError
from model.sources.layout import write_atomically

if TYPE_CHECKING:  # TensorFlow is imported only when training starts
    from model.schedules import EpochSchedule
    from model.towers import TowerTrainer

ProgressCallback = Callable[[dict[str, float]], None]
# Seconds between live progress reports (each one reads metrics from the devices).
PROGRESS_SECONDS = 1.0
EVAL_BATCH = 500
CONFIG_FILE = "train_config.json"
HISTORY_FILE = "history.json"


@dataclass
class TrainResult:
    """What a training run produced (see the Training contract in the conventions)."""

    config: TrainConfig
    history: list[dict[str, float]]
    final: dict[str, Any]
    status: str  # "completed" | "diverged"
    confusion_matrix: np.ndarray  # [classes, classes], rows = true class, raw weights
    classes: list[str]
    model: Any = field(repr=False)  # keras.Model with the final raw weights


def _write_json_atomically(path: Path, payload: Any) -> None:
    write_atomically(path, json.dumps(payload, indent=2).encode())


def check_config_against_data(config: TrainConfig, manifest) -> None:
    """Refuse settings the dataset cannot satisfy, naming the option."""
    examples = manifest.splits["train"].examples
    height, width, _ = manifest.image_shape
    if config.towers > examples:
        raise TowerbenchError(
            f"--towers {config.towers} exceeds the {examples} training examples of "
            f"{config.dataset!r}: every tower needs at least one example per step"
        )
    if config.global_batch > examples:
        raise TowerbenchError(
            f"--global-batch {config.global_batch} exceeds the {examples} training examples of "
            f"{config.dataset!r}"
        )
    if config.crop_size is not None and config.crop_size > min(height, width):
        raise TowerbenchError(
            f"--crop-size {config.crop_size} is larger than the {height}x{width} images of "
            f"{config.dataset!r} (use a smaller crop or --crop-size none)"
        )
    if "test" not in manifest.splits:
        raise TowerbenchError(f"dataset {config.dataset!r} has no test split to evaluate on")


def _load_dataset(config: TrainConfig, data_dir: Path):
    from model.tfrecords import MANIFEST_NAME, dataset_dir, load_manifest, split_files

    folder = dataset_dir(data_dir, config.dataset)
    if not (folder / MANIFEST_NAME).is_file():
        raise TowerbenchError(
            f"--dataset {config.dataset}: no preprocessed data in {folder}; run "
            f"`towerbench preprocess {config.dataset} --data-dir {data_dir}` first"
        )
    manifest = load_manifest(folder)
    check_config_against_data(config, manifest)
    return manifest, split_files(folder, manifest, "train"), split_files(folder, manifest, "test")


class _Evaluator:
    """Confusion matrix and mean cross-entropy of given weights on the whole test split."""

    def __init__(self, model, device: str, files, image_shape, crop_size, classes: int):
        import tensorflow as tf

        from model.input_pipeline import evaluation_dataset

        self.dataset = evaluation_dataset(files, image_shape, crop_size, EVAL_BATCH)
        self.model, self.device, self.classes = model, device, classes
        self.non_trainable = model.non_trainable_variables

        @tf.function
        def predict_batch(weights, images, labels, mask):
            with tf.device(self.device):
                logits, _ = self.model.stateless_call(
                    weights, [v.value for v in self.non_trainable], images, training=False
                )
                predictions = tf.argmax(logits, -1, tf.int32)
                kept = tf.where(mask, labels, 0)
                cross_entropy = tf.nn.sparse_softmax_cross_entropy_with_logits(kept, logits)
            # Padding (mask False) gets weight 0: counted nowhere.
            confusion = tf.math.confusion_matrix(
                kept,
                predictions,
                self.classes,
                weights=tf.cast(mask, tf.int64),
                dtype=tf.int64,
            )
            return confusion, tf.reduce_sum(tf.where(mask, cross_entropy, 0.0))

        self.predict_batch = predict_batch

    def evaluate(self, weights) -> tuple[np.ndarray, float]:
        """(confusion matrix, mean test cross-entropy) of `weights`."""
        import tensorflow as tf

        values = [tf.convert_to_tensor(w) for w in weights]
        total = np.zeros((self.classes, self.classes), np.int64)
        cross_entropy = 0.0
        for images, labels, mask in self.dataset:
            confusion, loss_sum = self.predict_batch(values, images, labels, mask)
            total += confusion.numpy()
            cross_entropy += float(loss_sum.numpy())
        return total, cross_entropy / max(int(total.sum()), 1)


def _accuracy(confusion: np.ndarray) -> float:
    return float(np.trace(confusion) / max(confusion.sum(), 1))


def _diverged(trainer: TowerTrainer, config: TrainConfig, classes: int) -> bool:
    """The last step's cross-entropy is NaN/inf or `divergence_factor` times chance level
    (reading it waits for the step)."""
    cross_entropy = float(trainer.last_cross_entropy.numpy())
    total = float(trainer.last_loss.numpy())
    limit = config.divergence_factor * math.log(classes)
    return not (math.isfinite(cross_entropy) and math.isfinite(total)) or cross_entropy > limit


# A run is unstable when an epoch's mean training cross-entropy rises above chance level
# (ln C, what predicting 1/C everywhere costs) by this factor, or when its loss did not fall and
# it ends within this factor of chance accuracy.
UNSTABLE_LOSS_FACTOR = 1.05
UNSTABLE_ACCURACY_FACTOR = 2.0


def instability(history: list[dict[str, float]], classes: int, test_accuracy: float) -> str | None:
    """Why this run counts as unstable (learning collapsed), or None."""
    chance_loss = math.log(classes)
    losses = [entry["cross_entropy"] for entry in history]
    worst = max(losses, default=0.0)
    if not math.isfinite(worst) or worst > UNSTABLE_LOSS_FACTOR * chance_loss:
        epoch = history[losses.index(worst)]["epoch"] if math.isfinite(worst) else None
        where = f" in epoch {math.ceil(epoch)}" if epoch is not None else ""
        return (
            f"training cross-entropy reached {worst:.2f}{where}, above chance level "
            f"ln {classes} = {chance_loss:.2f}"
        )
    # Near chance at the end after a loss that went nowhere or back up: collapsed, not just short.
    stalled = len(losses) >= 2 and losses[-1] >= losses[0]
    if stalled and test_accuracy < UNSTABLE_ACCURACY_FACTOR / classes:
        return (
            f"test accuracy {100 * test_accuracy:.1f}% is near chance ({100 / classes:.0f}%) "
            f"and the training cross-entropy did not fall ({losses[0]:.2f} -> {losses[-1]:.2f})"
        )
    return None


def _snapshot(
    trainer: TowerTrainer, schedule: EpochSchedule, step: int, steps_per_epoch: int, clock: _Clock
) -> dict[str, float]:
    """Where training is and its running metrics: the progress line and the epoch record."""
    epoch = step / steps_per_epoch
    return {
        "epoch": epoch,
        "step": float(step),
        "lr": float(schedule(epoch)),
        **trainer.read_metrics(),
        "images_per_sec": clock.epoch_rate(),
    }


def train(
    config: TrainConfig,
    data_dir: Path,
    checkpoint_dir: Path | None = None,
    on_epoch: ProgressCallback | None = None,
    on_progress: ProgressCallback | None = None,
) -> TrainResult:
    """Train `config` on DATA_DIR/tfrecords/<dataset>; resume from `checkpoint_dir` if it holds
    a checkpoint of the same configuration."""
    # Reading the manifest runs no TensorFlow op; the devices must be split before any op runs.
    data_dir = Path(data_dir)
    manifest, train_files, test_files = _load_dataset(config, data_dir)
    devices = configure_tower_devices(config.towers, config.device_type, config.parameter_device)
    import keras
    import tensorflow as tf

    from model.input_pipeline import (
        Distortions,
        EpochPlan,
        network_input_shape,
        train_dataset,
    )
    from model.networks import build_network
    from model.schedules import StepSchedule, schedule_from_config
    from model.towers import TowerTrainer

    plan = EpochPlan(manifest.splits["train"].examples, config.global_batch, config.towers)
    classes = len(manifest.classes)
    total_steps = max(round(config.epochs * plan.steps), 1)
    schedule = schedule_from_config(config)

    keras.utils.set_random_seed(config.seed)
    input_shape = network_input_shape(manifest.image_shape, config.crop_size)
    with tf.device(devices.parameter_device):
        network = build_network(config.model, input_shape, len(manifest.classes), config.seed)
    optimizer = keras.optimizers.SGD(
        learning_rate=StepSchedule(schedule, plan.steps),
        momentum=config.momentum if config.optimizer in ("momentum", "nesterov") else 0.0,
        nesterov=config.optimizer == "nesterov",
    )
    trainer = TowerTrainer(
        network,
        optimizer,
        devices,
        config.aggregation,
        config.weight_decay,
        config.ema_decay,
        config.xla,
    )
    evaluator = _Evaluator(
        network.model,
        devices.devices[0],
        test_files,
        manifest.image_shape,
        config.crop_size,
        len(manifest.classes),
    )
    checkpoint = tf.train.Checkpoint(
        weights=[variable.value for variable in network.model.variables],
        optimizer=[variable.value for variable in optimizer.variables],
        ema=trainer.ema_weights,
        noise=trainer.noise,
        metric_sums=[trainer.cross_entropy_sum, trainer.correct, trainer.examples],
    )
    history: list[dict[str, float]] = []
    manager = None
    if checkpoint_dir is not None:
        manager, history = _open_checkpoints(checkpoint, Path(checkpoint_dir), config)

    distortions = Distortions.from_config(config)
    step = int(optimizer.iterations.numpy())
    status = "completed"
    clock = _Clock()
    last_report = time.perf_counter()
    last_eval_epoch = history[-1]["epoch"] if history else 0.0
    confusion = None
    while step < total_steps and status == "completed":
        epoch_index, start = divmod(step, plan.steps)
        batches = train_dataset(
            train_files, manifest.image_shape, plan, distortions, config.seed, epoch_index, start
        )
        clock.start_epoch()
        for images, labels in batches:
            clock.step(trainer.step, images, labels)
            step += 1
            # A checkpoint that falls on an epoch's end is saved after the epoch's record.
            if _checkpoint_due(manager, config, step) and step % plan.steps:
                _save(manager, step, history)
            if step >= total_steps:
                break
            now = time.perf_counter()
            if now - last_report >= PROGRESS_SECONDS:  # reading from devices waits for them
                last_report = now
                if _diverged(trainer, config, classes):
                    status = "diverged"
                    break
                if on_progress is not None:
                    on_progress(_snapshot(trainer, schedule, step, plan.steps, clock))
        if _diverged(trainer, config, classes):
            status = "diverged"
        epoch = step / plan.steps
        record = {
            **_snapshot(trainer, schedule, step, plan.steps, clock),
            "step_time": clock.epoch_step_time(),
            "wall_time": clock.wall_time(),
        }
        trainer.reset_metrics()
        due = epoch - last_eval_epoch >= config.eval_every_epochs - 1e-9
        if due or step >= total_steps or status != "completed":
            last_eval_epoch = epoch
            confusion, record["test_cross_entropy"] = evaluator.evaluate(trainer.trainable)
            record["test_accuracy"] = _accuracy(confusion)
            record["ema_test_accuracy"] = _accuracy(evaluator.evaluate(trainer.ema_weights)[0])
        else:
            record["test_accuracy"] = record["ema_test_accuracy"] = float("nan")
            record["test_cross_entropy"] = float("nan")
        if devices.replicas > 1:
            record["noise_scale"] = trainer.noise.value()
        history.append(record)
        if manager is not None and step < total_steps:  # every epoch: a kill loses one at most
            _save(manager, step, history)
        if on_epoch is not None:
            on_epoch(record)
    if manager is not None:
        _save(manager, step, history)

    if confusion is None:  # resumed after the last step: nothing was evaluated in this process
        confusion, _ = evaluator.evaluate(trainer.trainable)
    final = _final_metrics(
        history, confusion, evaluator, trainer, devices, config, schedule, clock, step
    )
    return TrainResult(
        config, history, final, status, confusion, list(manifest.classes), network.model
    )


class _Clock:
    """Wall time, and steady-state speed without tracing/compiling."""

    def __init__(self):
        self.started = time.perf_counter()
        self.steady_seconds = 0.0
        self.steady_images = 0
        self.epoch_seconds = 0.0
        self.epoch_images = 0
        self.epoch_steps = 0

    def start_epoch(self) -> None:
        self.epoch_seconds, self.epoch_images, self.epoch_steps = 0.0, 0, 0

    def step(self, function, images, labels) -> None:
        """Run the compiled step `function`; a call that traced it is left out of steady speed."""
        traces = function.experimental_get_tracing_count()
        began = time.perf_counter()
        function(images, labels)
        seconds = time.perf_counter() - began
        count = int(images.shape[0])
        self.epoch_seconds += seconds
        self.epoch_images += count
        self.epoch_steps += 1
        if function.experimental_get_tracing_count() == traces:
            self.steady_seconds += seconds
            self.steady_images += count

    def epoch_rate(self) -> float:
        return self.epoch_images / self.epoch_seconds if self.epoch_seconds else float("nan")

    def epoch_step_time(self) -> float:
        return self.epoch_seconds / self.epoch_steps if self.epoch_steps else float("nan")

    def steady_rate(self) -> float:
        if not self.steady_seconds:
            return self.epoch_rate()
        return self.steady_images / self.steady_seconds

    def wall_time(self) -> float:
        return time.perf_counter() - self.started


def _final_metrics(
    history,
    confusion,
    evaluator,
    trainer,
    devices: TowerDevices,
    config: TrainConfig,
    schedule,
    clock: _Clock,
    step: int,
) -> dict[str, Any]:
    rate = clock.steady_rate()
    ema_accuracy = next(
        (
            entry["ema_test_accuracy"]
            for entry in reversed(history)
            if not math.isnan(entry["ema_test_accuracy"])
        ),
        None,
    )
    if ema_accuracy is None:  # no epoch evaluated the EMA weights in this process
        ema_accuracy = _accuracy(evaluator.evaluate(trainer.ema_weights)[0])
    final = {
        "test_accuracy": _accuracy(confusion),
        "ema_test_accuracy": ema_accuracy,
        "test_examples": int(confusion.sum()),
        "images_per_sec": rate,
        "step_time": config.global_batch / rate if rate else float("nan"),
        "wall_time": clock.wall_time(),
        "steps": step,
        "epochs": history[-1]["epoch"] if history else 0.0,
        "global_batch": config.global_batch,
        "per_tower_batch": config.global_batch // config.towers,
        "effective_lr": schedule.peak_lr,
        "device_kind": devices.kind,
        "device_names": list(devices.devices),
        "parameter_device": devices.parameter_device,
        "replicas": devices.replicas,
    }
    if devices.replicas > 1:
        final["noise_scale"] = trainer.noise.value()
    final.update(_final_losses(history))
    reason = instability(history, confusion.shape[0], final["test_accuracy"])
    if reason is not None:
        final["unstable"] = reason
    return final


# The last epoch's losses: what the loss paradox in the report is made of.
FINAL_LOSSES = ("cross_entropy", "weight_decay_loss", "total_loss")


def _final_losses(history: list[dict[str, float]]) -> dict[str, float]:
    """Training losses of the last epoch (all towers), the last test cross-entropy, the gap."""
    if not history:
        return {}
    losses = {f"train_{key}": history[-1][key] for key in FINAL_LOSSES}
    tested = [entry.get("test_cross_entropy", math.nan) for entry in history]
    tested = [value for value in tested if math.isfinite(value)]
    if tested:
        losses["test_cross_entropy"] = tested[-1]
        losses["generalization_gap"] = tested[-1] - losses["train_cross_entropy"]
    return losses


def _open_checkpoints(checkpoint, folder: Path, config: TrainConfig):
    """A CheckpointManager on `folder`, restored if it holds a run of the same configuration."""
    import tensorflow as tf

    folder.mkdir(parents=True, exist_ok=True)
    config_path = folder / CONFIG_FILE
    wanted = config.model_dump(mode="json", exclude={"epochs", "checkpoint_every"})
    manager = tf.train.CheckpointManager(checkpoint, str(folder), max_to_keep=2)
    history: list[dict[str, float]] = []
    if manager.latest_checkpoint:
        saved = json.loads(config_path.read_text()) if config_path.is_file() else {}
        different = sorted(name for name in wanted if saved.get(name) != wanted[name])
        if different:
            raise TowerbenchError(
                f"--checkpoint-dir {folder}: holds a run with different settings "
                f"({', '.join(different)}); use another folder to start a new run"
            )
        checkpoint.restore(manager.latest_checkpoint).assert_existing_objects_matched()
        step = int(manager.latest_checkpoint.rsplit("-", 1)[-1])
        history_path = folder / HISTORY_FILE
        if history_path.is_file():
            history = [
                entry for entry in json.loads(history_path.read_text()) if entry["step"] <= step
            ]
    else:
        _write_json_atomically(config_path, wanted)
    return manager, history


def _checkpoint_due(manager, config: TrainConfig, step: int) -> bool:
    every = config.checkpoint_every
    return manager is not None and every > 0 and step % every == 0


def _save(manager, step: int, history: list[dict[str, float]]) -> None:
    # History first: an entry beyond the checkpoint's step is ignored when resuming.
    _write_json_atomically(Path(manager.directory) / HISTORY_FILE, history)
    manager.save(checkpoint_number=step)
