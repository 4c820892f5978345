"""The training loop: set up a run, train it one epoch at a time, finish with its final metrics.

Each epoch gives an `EpochRecord` (model.records): cross-entropy averaged over ALL towers'
examples, the weight-decay term and their sum, train accuracy, test accuracy of the raw weights
and of their moving average (decay 0.9999), speed, LR, and for k >= 2 towers the noise scale.
With `lr_scaling: adascale` (model.adascale) the LR is the reference batch's schedule at the
progress tau times the gain, the run ends when tau reaches the reference batch's updates, and each
record carries the gain, sigma^2, |mu|^2 and tau.

With several workers (model.cluster) every worker runs this loop in step; the chief alone saves
checkpoints, and on a resume every worker starts from the chief's restored state.

Resuming (model.checkpoints) is exact: the data order and distortions are pure functions of
(seed, epoch, position) (model.input_pipeline) and nothing else draws random numbers after
initialisation, so a run resumed from step s replays the steps an uninterrupted run takes from s.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from towerbench.config.metrics import resolved_metric
from towerbench.config.sections import TrainConfig
from towerbench.core.errors import TowerbenchError
from towerbench.core.outcome import Status
from towerbench.model.clock import Clock
from towerbench.model.cluster import Cluster, broadcast_from_chief, collective_failure, join
from towerbench.model.devices import TowerDevices, configure_tower_devices, split_tower_devices
from towerbench.model.records import EpochRecord, FinalMetrics, TrainResult, last_losses
from towerbench.model.stability import diverged, instability
from towerbench.model.training_data import load_training_data, read_failure

if TYPE_CHECKING:  # set-up imports these: Keras and the graph builders load when training starts
    from towerbench.core.tfrecord_format import Manifest
    from towerbench.model.adascale import AdaScale, AdaScaleSchedule, ScaleInvariantBudget
    from towerbench.model.batch_norm_statistics import BatchNormStatistics
    from towerbench.model.checkpoints import Checkpoints
    from towerbench.model.evaluation import Evaluation, Evaluator
    from towerbench.model.input_pipeline import Distortions, EpochPlan
    from towerbench.model.networks import Network
    from towerbench.model.schedules import EpochSchedule, StepSchedule
    from towerbench.model.towers import TowerTrainer

ProgressCallback = Callable[[dict[str, float]], None]
EpochCallback = Callable[[EpochRecord], None]
# Seconds between live progress reports (each one reads metrics from the devices).
PROGRESS_SECONDS = 1.0


def train(
    config: TrainConfig,
    data_dir: Path,
    checkpoint_dir: Path | None = None,
    on_epoch: EpochCallback | None = None,
    on_progress: ProgressCallback | None = None,
) -> TrainResult:
    """Train `config` on DATA_DIR/tfrecords/<dataset>; resume from `checkpoint_dir` if it holds
    a checkpoint of the same configuration. A shard that cannot be read (damaged or deleted
    while training) is a TowerbenchError naming it."""
    cluster = _cluster(config)
    try:
        run = _set_up(config, Path(data_dir), checkpoint_dir, cluster)
        while not _at_end(run) and run.status == Status.COMPLETED:
            record = _train_one_epoch(run, on_progress)
            run.history.append(record)
            if run.checkpoints is not None and not _at_end(run):
                run.checkpoints.save(run.step, run.history)  # every epoch: a kill loses one
            if on_epoch is not None:
                on_epoch(record)
        return _finish(run)
    except Exception as error:
        # A shard damaged or deleted while training, then a worker lost: one line each.
        failure = read_failure(error, config, Path(data_dir)) or collective_failure(error, cluster)
        if failure is None:
            raise
        raise failure from None


@dataclass
class _Run:
    """One training run while it trains: what set-up built, and where training is."""

    config: TrainConfig
    manifest: Manifest
    train_files: list[str]
    cluster: Cluster
    devices: TowerDevices
    plan: EpochPlan
    total_steps: int
    schedule: EpochSchedule
    distortions: Distortions
    network: Network
    trainer: TowerTrainer
    evaluator: Evaluator
    checkpoints: Checkpoints | None
    history: list[EpochRecord]
    step: int
    status: Status = Status.COMPLETED
    clock: Clock = field(default_factory=Clock)
    last_report: float = field(default_factory=time.perf_counter)
    last_eval_epoch: float = 0.0
    evaluation: Evaluation | None = None  # the last one in this process
    # With BatchNorm: its statistics re-estimated at the evaluated weights, on fixed batches.
    batch_norm: BatchNormStatistics | None = None
    batch_norm_batches: list | None = None  # read at the first evaluation
    # adascale: the budget that extends `total_steps` until tau reaches it
    budget: ScaleInvariantBudget | None = None

    @property
    def classes(self) -> int:
        return len(self.manifest.classes)

    @property
    def epoch(self) -> float:
        return self.step / self.plan.steps


def _set_up(
    config: TrainConfig, data_dir: Path, checkpoint_dir: Path | None, cluster: Cluster
) -> _Run:
    """Data, devices, network, optimizer, towers and evaluator; restored from `checkpoint_dir`
    when it holds this run."""
    # Reading the manifest runs no TensorFlow op; the devices must be split before any op runs,
    # and the cluster joined after that.
    manifest, train_files, test_files = load_training_data(config, data_dir)
    split_tower_devices(config.towers, config.device_type)
    join(cluster)
    devices = configure_tower_devices(
        config.towers, config.device_type, config.parameter_device, config.workers
    )
    from towerbench.model.batch_norm_statistics import BatchNormStatistics, trains_batch_norm
    from towerbench.model.evaluation import Evaluator
    from towerbench.model.input_pipeline import Distortions, EpochPlan

    plan = EpochPlan(
        manifest.splits["train"].examples, config.global_batch, config.replicas, config.workers
    )
    network, trainer, rate = _tower_trainer(config, manifest, plan, devices, cluster)
    evaluator = Evaluator(
        network.model,
        devices.devices[0],
        test_files,
        manifest.features,
        config.crop_size,
        len(manifest.classes),
        config.loss,
        resolved_metric(config.metric, config.loss, manifest.labels),
        config.temperature,
        config.eval_candidates,
    )
    checkpoints, history, step = _restore(config, trainer, checkpoint_dir)
    return _Run(
        config=config,
        manifest=manifest,
        train_files=train_files,
        cluster=cluster,
        devices=devices,
        plan=plan,
        total_steps=_total_steps(config, plan, rate, step),
        schedule=rate.schedule,
        distortions=Distortions.from_config(config),
        network=network,
        trainer=trainer,
        evaluator=evaluator,
        checkpoints=checkpoints,
        history=history,
        step=step,
        # A resumed run counts from its last record, evaluated or not.
        last_eval_epoch=history[-1].epoch if history else 0.0,
        budget=rate.budget,
        batch_norm=BatchNormStatistics(network.model, devices.devices[0], config.towers)
        if trains_batch_norm(network.model)
        else None,
    )


def _tower_trainer(
    config: TrainConfig,
    manifest: Manifest,
    plan: EpochPlan,
    devices: TowerDevices,
    cluster: Cluster,
) -> tuple[Network, TowerTrainer, _LearningRate]:
    """The network at its seeded initial weights, its optimizer following the LR, and the
    tower step that trains it."""
    from towerbench.model.towers import seeded_network, tower_trainer

    network = seeded_network(config, manifest, devices.parameter_device)
    rate = _learning_rate(config, manifest, plan, devices)
    trainer = tower_trainer(network, config, devices, rate.learning_rate, cluster, rate.adascale)
    return network, trainer, rate


class _LearningRate(NamedTuple):
    """The LR in epochs and as the optimizer follows it; under adascale the gain that scales
    it and the budget of progress that ends the run."""

    schedule: EpochSchedule  # under adascale: the reference batch's
    learning_rate: StepSchedule | AdaScaleSchedule
    adascale: AdaScale | None
    budget: ScaleInvariantBudget | None


def _learning_rate(
    config: TrainConfig, manifest: Manifest, plan: EpochPlan, devices: TowerDevices
) -> _LearningRate:
    """The configured schedule, counted in the optimizer's steps; under adascale the
    reference batch's schedule at the progress tau, times the gain."""
    import tensorflow as tf

    from towerbench.config.optimizers import adascale_power
    from towerbench.model.adascale import (
        AdaScale,
        AdaScaleSchedule,
        ScaleInvariantBudget,
        reference_schedule,
        reference_steps_per_epoch,
    )
    from towerbench.model.schedules import StepSchedule, schedule_from_config

    schedule = schedule_from_config(config)
    if config.lr_scaling != "adascale":
        return _LearningRate(schedule, StepSchedule(schedule, plan.steps), None, None)
    examples = manifest.splits["train"].examples
    with tf.device(devices.parameter_device):
        adascale = AdaScale(config.reference_batch, config.global_batch, config.replicas)
    schedule = reference_schedule(config.base_lr, schedule)
    learning_rate = AdaScaleSchedule(
        StepSchedule(schedule, reference_steps_per_epoch(examples, config.reference_batch)),
        adascale_power(config.optimizer),
        adascale,
    )
    budget = ScaleInvariantBudget.of(
        config.epochs, examples, config.reference_batch, config.global_batch
    )
    return _LearningRate(schedule, learning_rate, adascale, budget)


def _total_steps(config: TrainConfig, plan: EpochPlan, rate: _LearningRate, step: int) -> int:
    """The configured epochs' steps; under adascale the fewest that could bring tau to its
    budget from `step` (see `_at_end`)."""
    if rate.budget is None or rate.adascale is None:
        return max(round(config.epochs * plan.steps), 1)
    return step + rate.budget.steps_left(rate.adascale.read().tau)


def _restore(
    config: TrainConfig, trainer: TowerTrainer, checkpoint_dir: Path | None
) -> tuple[Checkpoints | None, list[EpochRecord], int]:
    """The chief's checkpoints of this run, the history they hold and the step training goes
    on from (0 unless resumed); every worker starts from the chief's state."""
    from towerbench.model.checkpoints import Checkpoints, state_variables, training_state

    checkpoints: Checkpoints | None = None
    history: list[EpochRecord] = []
    state = training_state(trainer)
    if checkpoint_dir is not None and trainer.cluster.is_chief:
        checkpoints, history = Checkpoints.open(Path(checkpoint_dir), config, state)
    # Seeds agree on every worker; this also hands a resumed chief's state to the others.
    broadcast_from_chief(state_variables(state), trainer.cluster, trainer.devices.parameter_device)
    step = int(trainer.optimizer.iterations.numpy())
    if history:
        print(
            f"resuming from step {step} (epoch {history[-1].epoch:g}) of {checkpoint_dir}",
            file=sys.stderr,
            flush=True,
        )
    return checkpoints, history, step


def _at_end(run: _Run) -> bool:
    """Whether the run has made its last step. Under adascale `total_steps` is the fewest steps
    that could bring tau to its budget: tau is read (a wait for the device) only there."""
    if run.step < run.total_steps:
        return False
    adascale = run.trainer.adascale_state()
    if run.budget is None or adascale is None:
        return True
    left = run.budget.steps_left(adascale.tau)
    run.total_steps = run.step + left
    return left == 0


def _cluster(config: TrainConfig) -> Cluster:
    """The cluster of TF_CONFIG, which must have `config.workers` workers."""
    cluster = Cluster.from_environment(config.collective_timeout)
    if cluster.workers != config.workers:
        raise TowerbenchError(
            f"--workers {config.workers}: TF_CONFIG "
            + (f"lists {cluster.workers} workers" if cluster.addresses else "is not set")
            + (
                "; `towerbench train --workers N` starts a local cluster itself"
                if not cluster.addresses
                else ""
            )
        )
    return cluster


def _train_batches(run: _Run, epoch: int, start: int):
    """Epoch `epoch`'s training batches from step `start` on (this worker's slices)."""
    from towerbench.model.input_pipeline import train_dataset

    return train_dataset(
        run.train_files,
        run.manifest.features,
        run.plan,
        run.distortions,
        run.config.seed,
        epoch,
        start,
        run.cluster.index,
    )


def _train_one_epoch(run: _Run, on_progress: ProgressCallback | None) -> EpochRecord:
    """The rest of the current epoch (all of it unless resumed mid-epoch), stopping early at the
    run's last step or when the loss diverges; then the epoch's record."""
    epoch_index, start = divmod(run.step, run.plan.steps)
    batches = _train_batches(run, epoch_index, start)
    run.clock.start_epoch()
    for images, labels in batches:
        run.clock.step(run.trainer.step, images, labels)
        run.step += 1
        checkpoints = run.checkpoints
        if checkpoints is not None and checkpoints.due(run.step) and run.step % run.plan.steps:
            checkpoints.save(run.step, run.history)  # at an epoch's end: after its record
        if _at_end(run):
            break
        now = time.perf_counter()
        if now - run.last_report >= PROGRESS_SECONDS:  # reading from devices waits for them
            run.last_report = now
            # Workers check at the epoch's end only: they must stop at the same step.
            if run.cluster.workers == 1 and _diverged(run):
                run.status = Status.DIVERGED
                break
            if on_progress is not None:
                on_progress(_progress(run))
    if _diverged(run):
        run.status = Status.DIVERGED
    return _epoch_record(run)


def _diverged(run: _Run) -> bool:
    """Whether the last step diverged (reading its losses waits for the step)."""
    cross_entropy, total_loss = run.trainer.metrics.last_step()
    config = run.config
    return diverged(cross_entropy, total_loss, run.classes, config.divergence_factor, config.loss)


def _progress(run: _Run) -> dict[str, Any]:
    """Where training is and its running metrics (the LR: the mean of the steps so far): the
    live progress and the epoch record's start. A run not judged by accuracy has no training
    accuracy (NaN)."""
    trained = run.trainer.metrics.read()
    if run.evaluator.metric != "accuracy":
        trained["train_accuracy"] = math.nan
    return {
        "epoch": run.epoch,
        "step": run.step,
        **trained,
        "images_per_sec": run.clock.epoch_rate(),
        **_adascale_metrics(run),
    }


def _adascale_metrics(run: _Run) -> dict[str, float]:
    """Under adascale: the gain, sigma^2, |mu|^2 and tau (model.adascale.AdaScaleState)."""
    state = run.trainer.adascale_state()
    if state is None:
        return {}
    return {f"adascale_{name}": value for name, value in asdict(state).items()}


def _epoch_record(run: _Run) -> EpochRecord:
    """The epoch's training metrics, then (when due) its evaluation on the test split."""
    trained = {
        **_progress(run),
        "step_time": run.clock.epoch_step_time(),
        "wall_time": run.clock.wall_time(),
    }
    run.trainer.metrics.reset()
    tested = _test_metrics(run) if _evaluation_due(run) else {}
    return EpochRecord(**trained, **tested, noise_scale=run.trainer.noise_scale())


def _evaluation_due(run: _Run) -> bool:
    """Every `eval_every_epochs`, at the last step, and when the run stops early."""
    due = run.epoch - run.last_eval_epoch >= run.config.eval_every_epochs - 1e-9
    return due or _at_end(run) or run.status != Status.COMPLETED


def _test_metrics(run: _Run) -> dict[str, Any]:
    """Test loss and metric of the raw weights, the metric of their average, with the
    BatchNorm statistics `eval_bn` names (by accuracy: as test_accuracy too, and with
    BatchNorm the accuracies with both statistics)."""
    run.last_eval_epoch = run.epoch
    raw = _evaluations(run, run.trainer.trainable)
    ema = _evaluations(run, run.trainer.ema_weights)
    used = _statistics_used(run)
    run.evaluation = raw[used]
    metrics = {
        "test_cross_entropy": raw[used].loss,
        "test_metric": raw[used].metric,
        "ema_test_metric": ema[used].metric,
    }
    if run.evaluator.metric != "accuracy":
        return metrics
    metrics |= {"test_accuracy": raw[used].metric, "ema_test_accuracy": ema[used].metric}
    if run.batch_norm is None:
        return metrics
    return {
        **metrics,
        "test_accuracy_moving_bn": raw["moving"].metric,
        "test_accuracy_recomputed_bn": raw["recomputed"].metric,
        "ema_test_accuracy_recomputed_bn": ema["recomputed"].metric,
    }


def _statistics_used(run: _Run) -> str:
    """Which BatchNorm statistics the run's test accuracy uses (moving without BatchNorm)."""
    return run.config.eval_bn if run.batch_norm is not None else "moving"


def _evaluations(run: _Run, weights) -> dict[str, Evaluation]:
    """`weights` on the test split with BatchNorm's moving statistics and, with BatchNorm, with
    statistics re-estimated at them (model.batch_norm_statistics)."""
    from towerbench.model.batch_norm_statistics import RECOMPUTE_BATCHES

    done = {"moving": run.evaluator.evaluate(weights)}
    if run.batch_norm is None:
        return done
    if run.batch_norm_batches is None:  # epoch 0's first batches (this worker's slices)
        batches = _train_batches(run, 0, 0).take(RECOMPUTE_BATCHES)
        run.batch_norm_batches = [images for images, _ in batches]
    estimated = run.batch_norm.estimate(weights, run.batch_norm_batches)
    done["recomputed"] = run.evaluator.evaluate(weights, estimated)
    return done


def _finish(run: _Run) -> TrainResult:
    """The last checkpoint, the final evaluation (unless the last epoch's stands), the result."""
    if run.checkpoints is not None:
        run.checkpoints.save(run.step, run.history)
    if run.evaluation is None:  # resumed after the last step: nothing evaluated in this process
        run.evaluation = _evaluations(run, run.trainer.trainable)[_statistics_used(run)]
    if _statistics_used(run) == "recomputed":
        _adopt_recomputed_statistics(run)
    return TrainResult(
        config=run.config,
        history=run.history,
        final=_final_metrics(run, run.evaluation),
        status=run.status,
        confusion_matrix=run.evaluation.confusion,
        classes=list(run.manifest.classes),
        model=run.network.model,
        labels=run.manifest.labels,
    )


def _adopt_recomputed_statistics(run: _Run) -> None:
    """The trained model (logged, served) takes the statistics its test accuracy was measured
    with: BatchNorm's re-estimated at the final weights (after the last checkpoint, which keeps
    the moving ones training resumes from)."""
    if run.batch_norm is None or run.batch_norm_batches is None:
        return
    weights = [v.value for v in run.trainer.trainable]
    estimated = run.batch_norm.estimate(weights, run.batch_norm_batches)
    for variable, value in zip(run.network.model.non_trainable_variables, estimated, strict=True):
        variable.assign(value)


def _effective_lr(run: _Run) -> float:
    """The peak LR after scaling. Under adascale the gain changes every step: the base LR times
    the run's mean gain tau / updates, the LR a fixed rule would need to make the same progress
    in as many updates."""
    adascale = run.trainer.adascale_state()
    if adascale is None or run.step == 0:
        return run.schedule.peak_lr
    return run.schedule.peak_lr * adascale.tau / run.step


def _last_batch_norm_metrics(history: list[EpochRecord]) -> dict[str, float | None]:
    """The last evaluation's accuracies with moving and re-estimated BatchNorm statistics."""
    evaluated = [r for r in history if r.test_accuracy_recomputed_bn is not None]
    if not evaluated:
        return {}
    last = evaluated[-1]
    return {
        "test_accuracy_moving_bn": last.test_accuracy_moving_bn,
        "test_accuracy_recomputed_bn": last.test_accuracy_recomputed_bn,
        "ema_test_accuracy_recomputed_bn": last.ema_test_accuracy_recomputed_bn,
    }


def _final_metrics(run: _Run, evaluation: Evaluation) -> FinalMetrics:
    """Final metrics, steady-state speed, where the run ran, its last losses and stability."""
    ema_values = [record.ema_test_metric for record in run.history]
    ema_value = next((value for value in reversed(ema_values) if not math.isnan(value)), None)
    if ema_value is None:  # no epoch evaluated the EMA weights in this process
        ema_value = _evaluations(run, run.trainer.ema_weights)[_statistics_used(run)].metric
    by_accuracy = run.evaluator.metric == "accuracy"
    config, devices, rate = run.config, run.devices, run.clock.steady_rate()
    return FinalMetrics(
        metric=run.evaluator.metric,
        test_metric=evaluation.metric,
        ema_test_metric=ema_value,
        test_accuracy=evaluation.metric if by_accuracy else None,
        ema_test_accuracy=ema_value if by_accuracy else None,
        test_examples=evaluation.examples,
        images_per_sec=rate,
        step_time=config.global_batch / rate if rate else math.nan,
        wall_time=run.clock.wall_time(),
        steps=run.step,
        epochs=run.history[-1].epoch if run.history else 0.0,
        global_batch=config.global_batch,
        per_tower_batch=config.global_batch // config.replicas,
        effective_lr=_effective_lr(run),
        device_kind=devices.kind,
        device_names=list(devices.devices),
        parameter_device=devices.parameter_device,
        replicas=devices.replicas,
        cluster=list(run.cluster.addresses),
        noise_scale=run.trainer.noise_scale(),
        **_last_batch_norm_metrics(run.history),
        **last_losses(run.history),
        unstable=instability(
            run.history,
            run.classes,
            evaluation.metric if by_accuracy else math.nan,
            config.loss,
        ),
    )
