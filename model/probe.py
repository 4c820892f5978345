"""A short probe of a network on its data before it is scaled to k towers (`towerbench advise`).

It measures three things:

- **The gradient noise scale** B_simple (McCandlish et al. 2018) along the 1-tower run's own
  start: a few hundred steps of the reference configuration, each batch's gradient computed as
  the mean of `MICRO_BATCHES` micro-batch gradients (towers on the first device), which gives the
  per-step estimates of model.noise_scale. The value reported is its moving average at the end
  of the probe (decay 0.99: about the last 100 steps). The noise scale grows as the loss falls,
  so this early value understates the gain a larger batch has later in training.
- **The largest stable learning rate at the k-tower batch**: a short run at each candidate LR, in
  increasing order, each with k towers on the devices a k-tower run gets (model.devices: k GPUs,
  or one GPU or the CPU split in k), so the k-tower step exactly, BatchNorm statistics per tower
  and per-device memory included. Each warms up linearly from the base LR over its first quarter,
  as a scaled-up recipe would, then holds. A run stops as soon as its training cross-entropy,
  averaged over the last `WINDOW` steps, rises above chance level ln C (or a step is not finite);
  the larger candidates are then not tried. "Above" allows the 5% that model.stability allows a
  finished run: a network starts at about ln C and may stay on that plateau for a few dozen steps
  before it learns.
- **Whether the network has BatchNorm** (linear scaling suits BatchNorm networks better), and
  then its lag: at the end of each stable LR trial, the accuracy on training batches with the
  moving statistics and with statistics re-estimated at the weights (model.batch_norm_statistics):
  the moving ones move once per step, and k towers make k times fewer steps an epoch.

It also times the k-tower step (the LR trials' wall time per step after the first
`UNTIMED_STEPS`, input included), from which advise predicts what its recipe costs.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from towerbench.config.losses import chance_loss, judged_by_accuracy
from towerbench.config.sections import TrainConfig
from towerbench.model.stability import UNSTABLE_LOSS_FACTOR
from towerbench.model.training_data import load_training_data

MICRO_BATCHES = 4  # gradients per step of the noise probe: the most of 4, 2 that divide its batch
WINDOW = 10  # steps the divergence check averages the training cross-entropy over
WARMUP_FRACTION = 0.25  # of each LR trial's steps
NOISE_SAMPLES = 5  # noise-scale values kept along the noise probe (to show it growing)
UNTIMED_STEPS = 5  # a trial's first steps (tracing, compiling, filling buffers) are not timed


@dataclass(frozen=True)
class NoiseProbe:
    """The noise scale at the end of the noise probe, and along it."""

    noise_scale: float | None  # None: nothing to estimate (a batch of 1)
    batch: int
    micro_batch: int
    steps: int
    learning_rate: float
    first_loss: float  # training cross-entropy, averaged over the first WINDOW steps
    last_loss: float  # ... over the last WINDOW steps
    along: list[tuple[int, float]] = field(default_factory=list)  # (step, noise scale)


@dataclass(frozen=True)
class LearningRateTrial:
    """One short run at `learning_rate` on the k-tower batch."""

    learning_rate: float
    steps: int  # made (fewer than asked when it diverged)
    last_loss: float
    diverged: str | None = None  # why it stopped early
    step_seconds: float | None = None  # wall time per step after UNTIMED_STEPS; None: too few
    # With BatchNorm, at the end of a stable trial: accuracy on training batches with the
    # moving statistics and with statistics re-estimated at the weights.
    accuracy_moving_bn: float | None = None
    accuracy_recomputed_bn: float | None = None


@dataclass(frozen=True)
class ProbeResult:
    has_batchnorm: bool
    classes: int
    noise: NoiseProbe
    trials: list[LearningRateTrial]
    seconds: float
    tower_devices: tuple[str, ...] = ()  # where the LR trials' towers ran
    device_kind: str | None = None  # model.devices: "physical GPU", "logical CPU", ...
    train_examples: int | None = None  # in the training split (an epoch)

    @classmethod
    def from_document(cls, document: dict[str, Any]) -> ProbeResult:
        """The result `dataclasses.asdict` wrote (as JSON: lists for tuples; other keys, such
        as the properties a document adds, ignored)."""
        noise = dict(document["noise"])
        noise["along"] = [(int(step), float(value)) for step, value in noise["along"]]
        fields = {name: document[name] for name in cls.__dataclass_fields__ if name in document}
        fields["noise"] = NoiseProbe(**noise)
        fields["trials"] = [LearningRateTrial(**trial) for trial in document["trials"]]
        fields["tower_devices"] = tuple(document.get("tower_devices", ()))
        return cls(**fields)

    @property
    def step_seconds(self) -> float | None:
        """Seconds per k-tower step: the median over the LR trials that were timed."""
        timed = sorted(t.step_seconds for t in self.trials if t.step_seconds is not None)
        return timed[len(timed) // 2] if timed else None

    @property
    def largest_stable_lr(self) -> float | None:
        """The largest candidate LR that stayed stable; 0.0 when none did."""
        stable = [trial.learning_rate for trial in self.trials if trial.diverged is None]
        return max(stable, default=0.0) if self.trials else None

    @property
    def batch_norm_trial(self) -> LearningRateTrial | None:
        """The largest stable trial, when it measured BatchNorm's lag."""
        stable = [t for t in self.trials if t.diverged is None and t.accuracy_moving_bn is not None]
        return max(stable, key=lambda t: t.learning_rate, default=None)

    @property
    def instability(self) -> str | None:
        """What happened at the first LR that diverged."""
        failed = [trial for trial in self.trials if trial.diverged is not None]
        if not failed:
            return None
        return f"at LR {failed[0].learning_rate:.3g}: {failed[0].diverged}"


def divergence(
    losses: list[float], classes: int, loss: str = "sparse_categorical_crossentropy"
) -> str | None:
    """Why a probe must stop after these per-step training losses, or None: the last is not
    finite, or the mean of the last WINDOW rises above chance level ln C (by more than the
    start's plateau: UNSTABLE_LOSS_FACTOR); a loss without a chance level only the first."""
    if not losses:
        return None
    step = len(losses)
    if not math.isfinite(losses[-1]):
        return f"the training loss was not a number at step {step}"
    chance = chance_loss(loss, classes)
    if step < WINDOW or chance is None:
        return None
    mean = sum(losses[-WINDOW:]) / WINDOW
    if mean > UNSTABLE_LOSS_FACTOR * chance:
        return (
            f"training cross-entropy {mean:.2f} (mean of steps {step - WINDOW + 1}-{step}) rose "
            f"above chance level ln {classes} = {chance:.2f} (by more than the start's plateau)"
        )
    return None


def probe(
    config: TrainConfig,
    data_dir: Path,
    towers: int,
    learning_rates: list[float],
    steps: int,
) -> ProbeResult:
    """Probe `config` (the 1-tower reference run) on DATA_DIR/tfrecords/<dataset>: its noise
    scale, then each of `learning_rates` (increasing) at `towers` x its batch, `steps` steps
    each."""
    started = time.perf_counter()
    large = config.model_copy(update={"global_batch": config.global_batch * towers})
    manifest, train_files, _ = load_training_data(large, Path(data_dir))
    from towerbench.model.devices import configure_tower_devices

    device = configure_tower_devices(towers, config.device_type, config.parameter_device)
    session = _Session(config, manifest, train_files, device)
    noise = session.noise_probe(steps)
    trials: list[LearningRateTrial] = []
    for learning_rate in learning_rates:
        trials.append(session.trial(learning_rate, towers, steps))
        if trials[-1].diverged is not None:
            break  # the larger candidates would not do better
    return ProbeResult(
        has_batchnorm=session.has_batchnorm,
        classes=len(manifest.classes),
        noise=noise,
        trials=trials,
        seconds=time.perf_counter() - started,
        tower_devices=tuple(device.devices),
        device_kind=device.kind,
        train_examples=manifest.splits["train"].examples,
    )


class _Session:
    """What every probe run shares: the data, the device, the network's builder."""

    def __init__(self, config: TrainConfig, manifest, train_files: list[str], device) -> None:
        self.config = config
        self.manifest = manifest
        self.train_files = train_files
        self.device = device
        self.has_batchnorm = False
        # BatchNorm's lag is measured in accuracy: for runs a class per example judges.
        self.classified = judged_by_accuracy(config.loss, manifest.labels)

    def _trainer(self, towers: int, learning_rate, on_first_device: bool = False):
        """A fresh network (the run's seed) and its tower step: `towers` towers, one per tower
        device, or all on the first one. The optimizer is the run's, with the hyperparameters
        the rule of its family gives it at that batch (an adaptive optimizer's square-root
        rule)."""
        from towerbench.model.batch_norm_statistics import has_batch_norm
        from towerbench.model.devices import TowerDevices
        from towerbench.model.towers import seeded_network, tower_trainer

        config = self.config
        if not on_first_device:  # the K-tower batch: the family's rule sets the hyperparameters
            batch = config.global_batch * towers
            config = config.model_copy(update={"global_batch": batch, "lr_scaling": "sqrt"})
        # At the K-tower batch an EMA rule the params ask for scales BatchNorm's momentum by K.
        network = seeded_network(config, self.manifest, self.device.parameter_device)
        self.has_batchnorm = has_batch_norm(network.model)
        devices = TowerDevices(
            devices=self.device.devices[:1] * towers if on_first_device else self.device.devices,
            parameter_device=self.device.parameter_device,
            kind=self.device.kind,
            replicas=towers,
        )
        averaged = config.model_copy(update={"aggregation": "mean"})
        return tower_trainer(network, averaged, devices, learning_rate, weight_average=False)

    def _batches(self, batch: int, towers: int) -> Iterator[tuple]:
        """The run's training batches of `batch` examples, epoch after epoch."""
        from towerbench.model.input_pipeline import Distortions, EpochPlan, train_dataset

        plan = EpochPlan(self.manifest.splits["train"].examples, batch, towers)
        distortions = Distortions.from_config(self.config)
        epoch = 0
        while True:
            yield from train_dataset(
                self.train_files,
                self.manifest.features,
                plan,
                distortions,
                self.config.seed,
                epoch,
            )
            epoch += 1

    def _run(self, trainer, batch: int, towers: int, steps: int, on_step=None):
        """Up to `steps` steps; the per-step cross-entropies, why it stopped early, and the wall
        time per step after UNTIMED_STEPS (None with too few)."""
        losses: list[float] = []
        classes = len(self.manifest.classes)
        timed_from = time.perf_counter()
        for images, labels in self._batches(batch, towers):
            if int(images.shape[0]) != batch:
                continue  # an epoch's short last batch: keep every step at one batch size
            trainer.step(images, labels)
            losses.append(trainer.metrics.last_step()[0])  # waits for the step
            if len(losses) == UNTIMED_STEPS:
                timed_from = time.perf_counter()
            if on_step is not None:
                on_step(len(losses))
            reason = divergence(losses, classes, self.config.loss)
            if reason is not None or len(losses) >= steps:
                timed = len(losses) - UNTIMED_STEPS
                seconds = (time.perf_counter() - timed_from) / timed if timed > 0 else None
                return losses, reason, seconds
        raise AssertionError("unreachable: the batches never end")

    def noise_probe(self, steps: int) -> NoiseProbe:
        """The reference run's start, its batch split into micro-batches on the one device."""
        batch, config = self.config.global_batch, self.config
        micro = next((m for m in (MICRO_BATCHES, 2) if batch % m == 0 and batch >= m), 1)
        trainer = self._trainer(micro, config.base_lr, on_first_device=True)
        along: list[tuple[int, float]] = []
        every = max(steps // NOISE_SAMPLES, 1)

        def noise_scale() -> float:
            value = trainer.noise_scale()
            return math.nan if value is None else value

        def sample(step: int) -> None:
            if micro > 1 and step % every == 0:
                along.append((step, noise_scale()))

        losses, _, _ = self._run(trainer, batch, micro, steps, sample)
        value = noise_scale()
        return NoiseProbe(
            noise_scale=value if math.isfinite(value) else None,
            batch=batch,
            micro_batch=batch // micro,
            steps=len(losses),
            learning_rate=config.base_lr,
            first_loss=_mean(losses[:WINDOW]),
            last_loss=_mean(losses[-WINDOW:]),
            along=along,
        )

    def trial(self, learning_rate: float, towers: int, steps: int) -> LearningRateTrial:
        """`steps` steps at `towers` towers' batch, warming up to `learning_rate`."""
        import keras

        base = min(self.config.base_lr, learning_rate)
        warmup = max(round(WARMUP_FRACTION * steps), 1)
        schedule = keras.optimizers.schedules.PolynomialDecay(
            base, warmup, learning_rate, power=1.0
        )  # from `base` up to `learning_rate` over `warmup` steps, then held there
        trainer = self._trainer(towers, schedule)
        batch = self.config.global_batch * towers
        losses, reason, seconds = self._run(trainer, batch, towers, steps)
        last = _mean(losses[-WINDOW:])
        lag: tuple[float | None, float | None] = (None, None)
        if self.has_batchnorm and reason is None and self.classified:
            lag = self._batch_norm_lag(trainer, batch, towers)
        return LearningRateTrial(learning_rate, len(losses), last, reason, seconds, *lag)

    def _batch_norm_lag(self, trainer, batch: int, towers: int) -> tuple[float, float]:
        """(accuracy with the moving statistics, with statistics re-estimated on the first
        RECOMPUTE_BATCHES training batches) on the next RECOMPUTE_BATCHES, at the weights."""
        from towerbench.model.batch_norm_statistics import (
            RECOMPUTE_BATCHES,
            BatchNormStatistics,
            accuracy_on,
        )

        stream = self._batches(batch, towers)
        estimate_on = [next(stream)[0] for _ in range(RECOMPUTE_BATCHES)]
        scored = [next(stream) for _ in range(RECOMPUTE_BATCHES)]
        model, device = trainer.model, self.device.devices[0]
        weights = [v.value for v in model.trainable_variables]
        statistics = BatchNormStatistics(model, device, towers)
        moving = [v.value for v in model.non_trainable_variables]
        estimated = statistics.estimate(weights, estimate_on)
        return (
            accuracy_on(model, device, weights, moving, scored),
            accuracy_on(model, device, weights, estimated, scored),
        )


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan
