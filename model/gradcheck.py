"""Proof that averaging tower gradients is exact: one batch, one set of weights, five ways.

(a) one device on the whole batch, (b) k towers averaged, (c) k towers summed, (d)
tf.distribute.MirroredStrategy on the same k devices with the loss scaled by the global batch
(tf.nn.compute_average_loss), which is what a TensorFlow user would write, and (e) one device
running the batch as the same k shards (each shard's own BatchNorm statistics, "ghost" BatchNorm,
and each shard's own loss): for BatchNorm networks (b) equals (e), not (a), and so it does for a
loss that is not a mean over examples (in_batch_softmax: measured directly as the per-example
losses of each shard against the whole batch's, `loss_vs_shards`). The parts that depend on the
batch are named, each with its cause, in one explanation. For a user's network (config.model_ref)
dropout is switched off for the check, its weight regularizers are added once and its activity
regularizers as the mean over shards, in every way alike. With several workers (model.cluster), (f)
every worker's k towers on its slice of the batch, averaged across workers too, against (a). For
each we take the data-loss gradient and the weights after one SGD step (learning rate GRADCHECK_LR,
the model's weight decay added once), and report per variable and overall the largest absolute
difference and the relative difference ||a - b||_inf / ||b||_inf against the single device. Then
the update check: for each optimizer asked for, UPDATE_STEPS steps of k towers averaged and of one
device on the same batches (its own defaults, the weight decay as that optimizer applies it):
stateful optimizers (momentum, Adam's moments, LARS' and LAMB's trust ratios) see the same averaged
gradient each step, so their weights must agree too.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict

from towerbench.config.losses import BATCH_DEPENDENCE, labels_taken
from towerbench.config.optimizers import ADAPTIVE
from towerbench.config.sections import TrainConfig
from towerbench.core.errors import TowerbenchError
from towerbench.core.tfrecord_format import LabelKind
from towerbench.model.cluster import Cluster, join
from towerbench.model.devices import TowerDevices, configure_tower_devices, split_tower_devices
from towerbench.model.precision import Precision

GRADCHECK_LR = 0.1
ONE_SGD_STEP = TrainConfig(optimizer="sgd", dataset="gradcheck")  # the ways' one step
NUM_CLASSES = 10
INPUT_SHAPES = {"tutorial": (24, 24, 3), "tutorial_bn": (24, 24, 3), "resnet20": (32, 32, 3)}
USER_INPUT_SHAPE = (32, 32, 3)  # a user's network unless another shape is given
# Largest relative gradient difference between towers and one device that rounding explains,
# per precision: float32 sums in another order; float16/bfloat16 also round every activation
# (bfloat16 keeps 8 bits of mantissa). Measured on the tutorial network (2 towers, batch 64):
# 1.2e-6, 3.2e-3 and 5.9e-2; the tolerances leave a factor of about 3 (float32: 10).
TOLERANCE: dict[str, float] = {"float32": 1e-5, "mixed_float16": 1e-2, "mixed_bfloat16": 2e-1}
# A variable whose reference gradient is at most this share of the largest over all variables
# is rounding noise around 0 (in_batch_softmax's candidate bias: adding one vector to every
# candidate moves a query's logits alike, so its gradient is exactly 0): its difference is taken
# relative to the whole gradient's scale, not to its own noise.
ZERO_LIKE = 1e-5
Way = tuple[list[np.ndarray], list[np.ndarray]]  # (data gradients, weights after one step)
UPDATE_STEPS = 3


class VariableDifference(BaseModel):
    """One variable: the largest absolute and the relative difference of its gradient, then of
    its weights after one step."""

    model_config = ConfigDict(frozen=True)

    variable: str
    grad_max_abs_diff: float
    grad_rel_diff: float
    weight_max_abs_diff: float
    weight_rel_diff: float


class Comparison(BaseModel):
    """One way against another (`a_vs_b`: a's difference from b)."""

    model_config = ConfigDict(frozen=True)

    # The largest over all variables: of the gradients, then of the weights after one step.
    max_abs_diff: float
    max_rel_diff: float
    weights_max_abs_diff: float
    weights_max_rel_diff: float
    per_variable: list[VariableDifference]


class SumVsMean(BaseModel):
    """The summed tower gradients against k x the averaged ones."""

    model_config = ConfigDict(frozen=True)

    ratio: float  # of their norms
    expected_ratio: int  # k
    max_abs_diff_from_k_times_mean: float
    max_rel_diff_from_k_times_mean: float


class UpdateCheck(BaseModel):
    """One optimizer: k towers' weights against one device's after UPDATE_STEPS steps, over all
    weights at once (||a - b||_inf / ||b||_inf of the whole weight vector: an adaptive
    optimizer's step is about the LR whatever the gradient's size, so the rounding of a
    near-zero gradient moves a bias that starts at 0 by a large fraction of its small self)."""

    model_config = ConfigDict(frozen=True)

    optimizer: str
    steps: int
    learning_rate: float
    max_abs_diff: float
    max_rel_diff: float
    # Variables whose gradient is rounding noise around 0 (ZERO_LIKE), left out of the weights
    # compared: an adaptive optimizer turns noise below its epsilon into steps of LR x g / eps.
    left_out: list[str] = []


class GradcheckResult(BaseModel):
    """The ways' differences on one batch, with the verdict and what explains it: what
    `towerbench gradcheck` prints, and (`to_json`) its `--json` and MLflow's gradcheck.json."""

    model_config = ConfigDict(frozen=True)

    # What was compared: the network, the towers and batch, the devices, the one SGD step.
    model: str
    towers: int
    global_batch: int
    device_kind: str
    devices: list[str]
    learning_rate: float
    weight_decay: float
    loss: str = "sparse_categorical_crossentropy"
    cross_tower: str = "local"  # gather: each tower's loss sees every tower's candidates
    # What in the network makes towers differ: BatchNorm, and the dropout layers switched off.
    batchnorm: bool
    dropout_disabled: list[str]
    # The precision, and the relative difference its rounding explains.
    precision: Precision
    tolerance: float
    # Each way against another.
    mean_vs_single: Comparison
    sum_vs_mean: SumVsMean
    mirrored_vs_single: Comparison
    mirrored_vs_mean: Comparison
    ghost_vs_mean: Comparison
    # The per-example losses of each tower's shard against the whole batch's (relative): above
    # the tolerance, the loss is not a mean over examples.
    loss_vs_shards: float = 0.0
    # In a cluster only: the workers, and their towers against one device.
    workers: int | None = None
    workers_vs_single: Comparison | None = None
    # Each optimizer's weights after UPDATE_STEPS steps, towers against one device.
    updates_vs_single: list[UpdateCheck] = []

    @property
    def loss_batch_dependent(self) -> bool:
        return self.loss_vs_shards > self.tolerance

    @property
    def gathered(self) -> bool:
        return self.cross_tower == "gather"

    @property
    def batch_dependent(self) -> list[str]:
        """The parts whose value on a tower's B/k examples is not their share of the batch's."""
        return ["BatchNorm"] * self.batchnorm + [self.loss] * self.loss_batch_dependent

    @property
    def passed(self) -> bool:
        """Towers, MirroredStrategy (and workers) agree with one device, or with ghost BatchNorm
        on a BatchNorm network, within the tolerance; and so do the optimizers' updates on a
        network without BatchNorm. A loss that is not a mean over examples passes only gathered
        (cross_tower gather): local towers train another objective than the batch's."""
        per_shard = self.batchnorm and not self.loss_batch_dependent
        reference = self.ghost_vs_mean if per_shard else self.mean_vs_single
        compared: list[Comparison | UpdateCheck] = [reference]
        if not self.gathered:  # MirroredStrategy's replicas here take their own candidates
            compared.append(self.mirrored_vs_mean)
        if not self.batchnorm:
            compared += self.updates_vs_single
        if self.workers_vs_single is not None and not self.batchnorm:
            compared.append(self.workers_vs_single)
        return all(item.max_rel_diff <= self.tolerance for item in compared)

    @property
    def explanation(self) -> str:
        """What the differences say about averaging towers, in sentences."""
        return _explanation(self)

    def to_json(self) -> dict[str, Any]:
        """The JSON document: every field (the workers' only in a cluster), then `passed` and
        `explanation`."""
        document = self.model_dump(mode="json", exclude_none=True)
        return document | {
            "passed": self.passed,
            "batch_dependent": self.batch_dependent,
            "explanation": self.explanation,
        }


def _dense(gradient: Any) -> np.ndarray:
    """A gradient as an array: an Embedding's comes as IndexedSlices (the rows it touched)."""
    import tensorflow as tf

    return tf.convert_to_tensor(gradient).numpy()


@dataclass(frozen=True)
class _Problem:
    """What every way of computing the gradient shares: one batch, one network, one start."""

    model: str
    loss: str
    num_classes: int
    initial: list[np.ndarray]
    weight_decay: float
    seed: int
    images: Any  # tf.Tensor (B, H, W, C)
    labels: Any  # tf.Tensor: class ids (B,), or rows (B, num_classes) for the other losses
    precision: Precision
    temperature: float = 1.0  # in_batch_softmax's
    cross_tower: str = "local"

    def per_example_loss(self):
        from towerbench.model.losses import per_example_loss

        return per_example_loss(self.loss, self.temperature)

    def network(self):
        """The network at the initial weights, its dropout switched off."""
        from towerbench.model.networks import build_network
        from towerbench.model.user_model import disable_dropout

        shape = self.images.shape[1:]
        network = build_network(
            self.model, shape, self.num_classes, self.seed, self.precision, self.loss
        )
        network.model.set_weights(self.initial)
        disable_dropout(network.model)
        return network


def _call_losses(model):
    """The losses the model's last call added (activity regularizers), its weight regularizers
    (which Keras lists last) left out."""
    import tensorflow as tf

    regularized = sum(
        getattr(v, "regularizer", None) is not None for v in model.trainable_variables
    )
    losses = model.losses[: len(model.losses) - regularized]
    return tf.add_n(losses) if losses else tf.constant(0.0)


def _decay_loss(network, weight_decay: float):
    """weight_decay x tf.nn.l2_loss of the decayed variables + the model's weight regularizers."""
    from towerbench.model.weight_decay import WeightDecay

    return WeightDecay(network, weight_decay).loss()


def _rounding_noise(gradients: list[np.ndarray]) -> list[bool]:
    """Per variable: whether its gradient is rounding noise around 0, at most ZERO_LIKE times
    the largest of all `gradients`."""
    overall = max(float(np.max(np.abs(g))) for g in gradients)
    return [float(np.max(np.abs(g))) <= ZERO_LIKE * overall for g in gradients]


def _differences(
    a: list[np.ndarray], b: list[np.ndarray], gradients: bool = False
) -> list[tuple[float, float]]:
    """Per variable: the largest absolute difference of a from b, and that over b's largest
    absolute value (||a - b||_inf / ||b||_inf); for `gradients`, over all of b's where the
    variable's is rounding noise around 0 (`_rounding_noise`)."""
    overall = max(float(np.max(np.abs(right))) for right in b) if gradients else 0.0
    noise = _rounding_noise(b) if gradients else [False] * len(b)
    differences = []
    for left, right, is_noise in zip(a, b, noise, strict=True):
        absolute = float(np.max(np.abs(left - right)))
        scale = overall if is_noise else float(np.max(np.abs(right)))
        differences.append((absolute, absolute / scale if scale else absolute))
    return differences


def _largest(differences: list[tuple[float, float]]) -> tuple[float, float]:
    """The largest absolute and the largest relative difference over all variables."""
    return max(item[0] for item in differences), max(item[1] for item in differences)


def _comparison(way: Way, reference: Way, names: list[str]) -> Comparison:
    """`way`'s differences from `reference`, of the gradients and of the weights after one step."""
    gradient = _differences(way[0], reference[0], gradients=True)
    after_step = _differences(way[1], reference[1])
    max_abs_diff, max_rel_diff = _largest(gradient)
    weights_max_abs_diff, weights_max_rel_diff = _largest(after_step)
    return Comparison(
        max_abs_diff=max_abs_diff,
        max_rel_diff=max_rel_diff,
        weights_max_abs_diff=weights_max_abs_diff,
        weights_max_rel_diff=weights_max_rel_diff,
        per_variable=[
            VariableDifference(
                variable=name,
                grad_max_abs_diff=g[0],
                grad_rel_diff=g[1],
                weight_max_abs_diff=w[0],
                weight_rel_diff=w[1],
            )
            for name, g, w in zip(names, gradient, after_step, strict=True)
        ],
    )


def _tower_run(
    problem: _Problem, devices: TowerDevices, aggregation: str, cluster: Cluster | None = None
) -> Way:
    """(data gradients, weights after one step) of the tower trainer (of every worker's, whose
    problem holds its slice of the batch, in a cluster)."""
    import tensorflow as tf

    from towerbench.model.towers import tower_trainer

    with tf.device(devices.parameter_device):
        network = problem.network()
    config = ONE_SGD_STEP.model_copy(
        update={
            "loss": problem.loss,
            "temperature": problem.temperature,
            "cross_tower": problem.cross_tower,
            "aggregation": aggregation,
            "weight_decay": problem.weight_decay,
            "precision": problem.precision,
        }
    )
    trainer = tower_trainer(network, config, devices, GRADCHECK_LR, cluster, weight_average=False)
    gradients = [
        _dense(g) for g in trainer.gradients(problem.images, problem.labels).data_gradients
    ]
    trainer.step(problem.images, problem.labels)
    return gradients, [v.numpy() for v in network.model.trainable_variables]


def _update_config(problem: _Problem, optimizer: str):
    """`optimizer` with its defaults (no dataset preset) on the problem's network."""

    return TrainConfig(
        model=problem.model,
        dataset="gradcheck",
        optimizer=optimizer,
        precision=problem.precision,
        loss=problem.loss,
        temperature=problem.temperature,
        cross_tower=problem.cross_tower,
    )


def _weights_after_updates(problem: _Problem, devices: TowerDevices, optimizer: str) -> list:
    """The weights after UPDATE_STEPS averaged steps of `optimizer` (its default LR and
    hyperparameters), each step on its own batch of the problem's shape."""
    import tensorflow as tf

    from towerbench.model.towers import tower_trainer

    config = _update_config(problem, optimizer)
    with tf.device(devices.parameter_device):
        network = problem.network()
    trainer = tower_trainer(network, config, devices, config.base_lr, weight_average=False)
    batch = problem.images.shape
    for step in range(UPDATE_STEPS):
        seed = [problem.seed, 10 + step]
        images = tf.random.stateless_normal(batch, seed=seed)
        labels = _labels(problem.loss, _held(problem.labels), batch[0], problem.num_classes, seed)
        trainer.step(images, labels)
    return [v.numpy() for v in network.model.trainable_variables]


def _first_device(devices: TowerDevices) -> TowerDevices:
    """One tower on the first of `devices`: the one device every way is held against."""
    return TowerDevices(devices.devices[:1], devices.parameter_device, devices.kind, 1)


def _update_checks(
    problem: _Problem,
    devices: TowerDevices,
    optimizers: tuple[str, ...],
    gradients: list[np.ndarray],
    names: list[str],
) -> list[UpdateCheck]:
    """Each optimizer's weights after UPDATE_STEPS steps, k towers against one device, but for
    the variables whose one-device `gradients` are rounding noise around 0 (`_rounding_noise`)."""
    kept = [not noise for noise in _rounding_noise(gradients)]
    left_out = [name for name, keep in zip(names, kept, strict=True) if not keep]
    checks = []
    for optimizer in optimizers:
        towers = _weights_after_updates(problem, devices, optimizer)
        single = _weights_after_updates(problem, _first_device(devices), optimizer)
        flat = [
            np.concatenate([w.ravel() for w, keep in zip(weights, kept, strict=True) if keep])
            for weights in (towers, single)
        ]
        ((max_abs_diff, max_rel_diff),) = _differences([flat[0]], [flat[1]])
        checks.append(
            UpdateCheck(
                optimizer=optimizer,
                steps=UPDATE_STEPS,
                learning_rate=_update_config(problem, optimizer).base_lr,
                max_abs_diff=max_abs_diff,
                max_rel_diff=max_rel_diff,
                left_out=left_out,
            )
        )
    return checks


def _ghost_run(problem: _Problem, device: str, towers: int) -> Way:
    """One device, one tape, the global batch's mean loss, the batch run as k shards of B/k
    examples: BatchNorm normalises each shard by its own statistics ("ghost" BatchNorm, Hoffer et
    al. 2017) and each shard's examples get their loss among the shard's, as towers do. No
    per-tower gradients are averaged here."""
    import tensorflow as tf

    per_example = problem.per_example_loss()
    with tf.device(device):
        network = problem.network()
        variables = network.model.trainable_variables
        with tf.GradientTape(persistent=True) as tape:
            losses, call_losses = [], []
            images, labels = tf.split(problem.images, towers), tf.split(problem.labels, towers)
            for shard, shard_labels in zip(images, labels, strict=True):
                losses.append(per_example(shard_labels, network.model(shard, training=True)))
                call_losses.append(_call_losses(network.model))
            loss = tf.reduce_mean(tf.concat(losses, 0)) + tf.add_n(call_losses) / towers
            decay_loss = _decay_loss(network, problem.weight_decay)
        gradients = [_dense(g) for g in tape.gradient(loss, variables)]
        decay_gradients = tape.gradient(decay_loss, variables)
        for variable, gradient, extra in zip(variables, gradients, decay_gradients, strict=True):
            extra = 0 if extra is None else extra.numpy()
            variable.assign(variable.numpy() - GRADCHECK_LR * (gradient + extra))
    return gradients, [v.numpy() for v in variables]


def _loss_vs_shards(problem: _Problem, towers: int) -> float:
    """The per-example losses of each of k shards taken on its own against the whole batch's,
    on the same outputs (relative): rounding level for a mean over examples, beyond it for a
    loss that depends on the batch."""
    import tensorflow as tf

    per_example = problem.per_example_loss()
    outputs = problem.network().model(problem.images, training=False)
    whole = per_example(problem.labels, outputs)
    pairs = zip(tf.split(problem.labels, towers), tf.split(outputs, towers), strict=True)
    shards = tf.concat([per_example(labels, shard) for labels, shard in pairs], 0)
    ((_, relative),) = _differences([shards.numpy()], [whole.numpy()])
    return relative


def _mirrored_run(problem: _Problem, devices: TowerDevices) -> Way:
    """The same with MirroredStrategy: per-replica loss = sum / global batch, gradients summed."""
    import tensorflow as tf

    from towerbench.model.optimizers import build_optimizer

    # Reducing on the parameter device (rather than collectives, the CPU default) lets several
    # strategies over different device sets live in one process.
    strategy = tf.distribute.MirroredStrategy(
        devices.devices,
        cross_device_ops=tf.distribute.ReductionToOneDevice(devices.parameter_device),
    )
    images, labels, weight_decay = problem.images, problem.labels, problem.weight_decay
    batch = int(images.shape[0])
    towers = len(devices.devices)
    with strategy.scope():
        network = problem.network()
        optimizer = build_optimizer(ONE_SGD_STEP, GRADCHECK_LR)
        optimizer.build(network.model.trainable_variables)
    variables = network.model.trainable_variables

    def shard(context):
        size = batch // towers
        start = context.replica_id_in_sync_group * size
        return images[start : start + size], labels[start : start + size]

    def replica_step(inputs):
        shard_images, shard_labels = inputs
        with tf.GradientTape(persistent=True) as tape:
            logits = network.model(shard_images, training=True)
            per_example = problem.per_example_loss()(shard_labels, logits)
            data_loss = tf.nn.compute_average_loss(
                per_example, global_batch_size=batch
            ) + tf.nn.scale_regularization_loss(_call_losses(network.model))
            decay_loss = tf.nn.scale_regularization_loss(_decay_loss(network, weight_decay))
        data_gradients = tape.gradient(data_loss, variables)
        decay_gradients = tape.gradient(decay_loss, variables)
        total = [
            g if d is None else g + d for g, d in zip(data_gradients, decay_gradients, strict=True)
        ]
        optimizer.apply_gradients(zip(total, variables, strict=True))  # sums over replicas
        return data_gradients

    @tf.function(autograph=False)  # also leaves `replica_step` unconverted
    def run(inputs):
        per_replica = strategy.run(replica_step, args=(inputs,))
        return [strategy.reduce(tf.distribute.ReduceOp.SUM, g, axis=None) for g in per_replica]

    inputs = strategy.experimental_distribute_values_from_function(shard)
    gradients = [_dense(g) for g in run(inputs)]
    return gradients, [np.asarray(v.numpy()) for v in variables]


def _batch_dependence(result: GradcheckResult) -> list[str]:
    """Each part that depends on the batch, with what a tower computes differently on its B/k
    examples: BatchNorm, and a loss that is not a mean over examples."""
    shard, batch = result.global_batch // result.towers, result.global_batch
    causes = []
    if result.batchnorm:
        causes.append(
            "BatchNorm: each BatchNorm normalises a tower's examples with that tower's own "
            f"statistics (mean and variance of {shard} examples, not {batch}), a different "
            "function from BatchNorm over the whole batch, as MirroredStrategy's replicas "
            "compute it too."
        )
    if result.loss_batch_dependent and result.gathered:
        causes.append(
            f"{result.loss} depends on the batch (the per-example losses of a tower's {shard} "
            f"examples differ from the batch's by {result.loss_vs_shards:.2e}), and "
            f"cross_tower gather gives each tower's loss all {batch} candidates of the batch, "
            "gathered across the towers with gradients through each tower's own: the towers "
            "compute one device's loss."
        )
    elif result.loss_batch_dependent:
        known = BATCH_DEPENDENCE.get(result.loss)
        causes.append(
            f"{result.loss}: "
            + (
                known.format(shard=shard, batch=batch)
                if known
                else "it is not a mean over examples: each example's loss among a tower's "
                f"{shard} examples differs from its loss among the batch's {batch}"
            )
            + f" (the per-example losses differ by {result.loss_vs_shards:.2e}), so averaged "
            "towers train another objective than one device on the batch."
        )
    return causes


def _cause(result: GradcheckResult) -> str:
    """What the measured differences say the towers-vs-one-device difference comes from."""
    tolerance, precision = result.tolerance, result.precision
    single = result.mean_vs_single.max_rel_diff
    ghost = result.ghost_vs_mean.max_rel_diff
    parts = result.batch_dependent
    ghost_text = (
        f", towers vs one device running the batch as per-tower shards"
        f"{' (ghost BatchNorm)' if result.batchnorm else ''} {ghost:.2e}"
        if parts
        else ""
    )
    measured = (
        f"Measured (relative difference of gradients): towers vs one device {single:.2e}"
        f"{ghost_text}; tolerance {tolerance:g} in {precision}."
    )
    causes = " ".join(_batch_dependence(result))
    if single <= tolerance:
        return (
            f"{measured} That is rounding level: what remains is {precision} rounding, each "
            "tower summing its own examples before the partial sums are added, a different order "
            "of additions than one device's." + (f" {causes}" if result.gathered else "")
        )
    if parts and ghost <= tolerance:
        return (
            f"{measured} Only the per-shard comparison is at rounding level, so the difference "
            f"from one device is {' and '.join(parts)}, not averaging. {causes}"
        )
    return (
        f"{measured} That is above the tolerance, and not explained by rounding"
        + (f" nor by {' and '.join(parts)} alone" if parts else "")
        + "; the per-variable table shows where it is."
        + (f" {causes}" if causes else "")
    )


def _explanation(result: GradcheckResult) -> str:
    towers = result.towers
    lines = [
        f"Averaging {towers} tower gradients computes the gradient of the global batch's mean "
        "loss: the same mathematics as one device on the whole batch, for a loss that is a mean "
        "over examples and a network without BatchNorm.",
        _cause(result),
        f"Summing instead of averaging gives exactly {towers} x the averaged data-loss gradient "
        f"(measured ratio {result.sum_vs_mean.ratio:.6f}); with SGD that is a {towers} x "
        "larger learning rate.",
        "MirroredStrategy sums per-replica gradients; scaling each replica's loss by the global "
        "batch (tf.nn.compute_average_loss) makes that sum the mean, so it agrees with the "
        f"towers to {result.mirrored_vs_mean.max_rel_diff:.2e} (with one device: "
        f"{result.mirrored_vs_single.max_rel_diff:.2e})"
        + (
            "; its replicas here score their own candidates only (cross_tower local)."
            if result.gathered
            else "."
        ),
    ]
    if result.dropout_disabled:
        lines.append(
            f"Dropout was switched off for the check ({', '.join(result.dropout_disabled)}): "
            "in training each tower draws its own mask."
        )
    if result.precision != "float32":
        lines.append(
            f"In {result.precision} every layer rounds its activations to 16 bits, so the "
            "order of additions matters more: the stated tolerance for this precision is "
            f"{result.tolerance:g} (float32: {TOLERANCE['float32']:g})."
        )
    if result.updates_vs_single:
        worst = max(result.updates_vs_single, key=lambda check: check.max_rel_diff)
        names = ", ".join(check.optimizer for check in result.updates_vs_single)
        after = f"After {worst.steps} steps of each optimizer ({names}), the towers' weights"
        lines.append(
            f"{after} differ from one device's by up to {worst.max_rel_diff:.2e} "
            f"({worst.optimizer}): each step's gradient is another objective's."
            if result.loss_batch_dependent and not result.gathered
            else f"{after} equal one device's to {worst.max_rel_diff:.2e} at most "
            f"({worst.optimizer}): every step sees the same averaged gradient, so the "
            "optimizers' own state (momentum, moments, trust ratios) agrees too"
            + (", up to BatchNorm's per-tower statistics." if result.batchnorm else ".")
        )
        if worst.left_out:
            lines.append(
                f"Left out of that comparison: {', '.join(worst.left_out)}, whose gradient is "
                f"rounding noise around 0; an adaptive optimizer ({', '.join(sorted(ADAPTIVE))}) "
                "turns noise below its epsilon into steps of about LR x g / epsilon, which "
                "differ wherever the noise does."
            )
    if result.workers is not None and result.workers_vs_single is not None:
        workers = result.workers
        lines.append(
            f"Across {workers} worker processes of {towers} towers each, every worker averages "
            "its towers' gradients of its slice of the batch and one all-reduce averages the "
            f"workers': {workers * towers} equal shards again, so it agrees with one device to "
            f"{result.workers_vs_single.max_rel_diff:.2e}."
        )
    return " ".join(lines)


def _tower_devices(towers: int, global_batch: int, cluster: Cluster) -> TowerDevices:
    """This worker's tower devices, once the batch is known to split over every tower and the
    cluster is joined."""
    replicas = towers * cluster.workers
    if global_batch < 1 or global_batch % replicas:
        raise TowerbenchError(
            f"--global-batch {global_batch} must be a positive multiple of the {replicas} towers"
        )
    split_tower_devices(towers)
    join(cluster)
    return configure_tower_devices(towers, workers=cluster.workers)


@dataclass(frozen=True)
class _Feed:
    """What the fixed batch holds: inputs of `shape` (token ids 0 and 1 when `integer_inputs`,
    which every vocabulary holds), and labels of `width` classes or columns as `loss` takes
    them (a user's loss: `held`, the kind its dataset holds)."""

    shape: tuple[int, ...]
    width: int
    integer_inputs: bool
    loss: str
    temperature: float
    cross_tower: str
    held: LabelKind


def _problem(
    model: str, global_batch: int, seed: int, precision: Precision, feed: _Feed, devices
) -> tuple[_Problem, Any]:
    """The fixed batch and initial weights every way starts from, and the reference network
    (keras.Model) they were taken from."""
    import keras
    import tensorflow as tf

    from towerbench.model.networks import build_network

    weight_decay = TrainConfig(model=model, dataset="gradcheck").weight_decay
    shape = (global_batch, *feed.shape)
    if feed.integer_inputs:
        images = tf.random.stateless_uniform(shape, [seed, 1], 0, 2, tf.int32)
    else:
        images = tf.random.stateless_normal(shape, seed=[seed, 1])
    labels = _labels(feed.loss, feed.held, global_batch, feed.width, [seed, 2])
    keras.utils.set_random_seed(seed)
    with tf.device(devices.parameter_device):
        reference = build_network(model, feed.shape, feed.width, seed, loss=feed.loss).model
    initial = reference.get_weights()
    problem = _Problem(
        model,
        feed.loss,
        feed.width,
        initial,
        weight_decay,
        seed,
        images,
        labels,
        precision,
        feed.temperature,
        feed.cross_tower,
    )
    return problem, reference


def _held(labels) -> LabelKind:
    return "class_ids" if labels.shape.rank == 1 else "rows"


def _labels(loss: str, held: LabelKind, batch: int, width: int, seed: list[int]):
    """Random labels of the kind `loss` takes (a user's loss: `held`, the dataset's): class
    ids; soft class rows (a softmax), for categorical_crossentropy and a user's loss; 0/1 rows
    (multi-hot) for binary_crossentropy; normal targets."""
    import tensorflow as tf

    if labels_taken(loss, held) == "class_ids":
        return tf.random.stateless_uniform((batch,), seed, 0, width, tf.int32)
    values = tf.random.stateless_normal((batch, width), seed)
    if loss not in ("binary_crossentropy", "mse", "mae", "huber"):
        return tf.nn.softmax(2.0 * values)
    if loss == "binary_crossentropy":
        return tf.cast(values > 0, tf.float32)
    return values


def _workers_run(problem: _Problem, devices: TowerDevices, cluster: Cluster) -> Way:
    """Every worker's towers on its slice of the batch, averaged across the workers too."""
    size = int(problem.images.shape[0]) // cluster.workers
    part = slice(cluster.index * size, (cluster.index + 1) * size)
    mine = replace(problem, images=problem.images[part], labels=problem.labels[part])
    return _tower_run(mine, devices, "mean", cluster)


def _sum_vs_mean(summed: Way, mean: Way, towers: int) -> SumVsMean:
    """The summed towers' data gradients against k x the averaged towers'."""
    largest_abs, largest_rel = _largest(_differences(summed[0], [towers * g for g in mean[0]]))
    ratio = float(
        np.sqrt(sum(np.sum(g.astype(np.float64) ** 2) for g in summed[0]))
        / np.sqrt(sum(np.sum(g.astype(np.float64) ** 2) for g in mean[0]))
    )
    return SumVsMean(
        ratio=ratio,
        expected_ratio=towers,
        max_abs_diff_from_k_times_mean=largest_abs,
        max_rel_diff_from_k_times_mean=largest_rel,
    )


def run_gradcheck(
    model: str,
    towers: int,
    global_batch: int,
    seed: int = 0,
    cluster: Cluster | None = None,
    precision: Precision = "float32",
    input_shape: tuple[int, ...] | None = None,
    num_classes: int = NUM_CLASSES,
    optimizers: tuple[str, ...] = (),
    integer_inputs: bool = False,
    loss: str = "sparse_categorical_crossentropy",
    labels: LabelKind = "class_ids",
    temperature: float = 1.0,
    cross_tower: str = "local",
) -> GradcheckResult | None:
    """Compare one device, k towers (mean, sum) and MirroredStrategy on one fixed batch of
    `input_shape` inputs (default: the network's images, else USER_INPUT_SHAPE; token ids when
    `integer_inputs`) and labels `loss` takes (a user's loss: its dataset's `labels`), in a
    cluster the workers' towers, and `optimizers`' updates; only the chief returns a result."""
    from towerbench.model.batch_norm_statistics import has_batch_norm
    from towerbench.model.user_model import disable_dropout

    cluster = cluster or Cluster()
    devices = _tower_devices(towers, global_batch, cluster)
    shape = tuple(input_shape or INPUT_SHAPES.get(model, USER_INPUT_SHAPE))
    feed = _Feed(shape, num_classes, integer_inputs, loss, temperature, cross_tower, labels)
    problem, reference = _problem(model, global_batch, seed, precision, feed, devices)
    across = _workers_run(problem, devices, cluster) if cluster.workers > 1 else None
    if not cluster.is_chief:
        return None
    single = _tower_run(problem, _first_device(devices), "mean")
    mean = _tower_run(problem, devices, "mean")
    mirrored = _mirrored_run(problem, devices)
    names = [v.path for v in reference.trainable_variables]
    return GradcheckResult(
        model=model,
        towers=towers,
        global_batch=global_batch,
        device_kind=devices.kind,
        devices=list(devices.devices),
        learning_rate=GRADCHECK_LR,
        weight_decay=problem.weight_decay,
        loss=loss,
        cross_tower=cross_tower,
        batchnorm=has_batch_norm(reference),
        dropout_disabled=disable_dropout(reference),
        precision=precision,
        tolerance=TOLERANCE[precision],
        mean_vs_single=_comparison(mean, single, names),
        sum_vs_mean=_sum_vs_mean(_tower_run(problem, devices, "sum"), mean, towers),
        mirrored_vs_single=_comparison(mirrored, single, names),
        mirrored_vs_mean=_comparison(mirrored, mean, names),
        ghost_vs_mean=_comparison(mean, _ghost_run(problem, devices.devices[0], towers), names),
        loss_vs_shards=_loss_vs_shards(problem, towers),
        workers=cluster.workers if across is not None else None,
        workers_vs_single=None if across is None else _comparison(across, single, names),
        updates_vs_single=_update_checks(problem, devices, optimizers, single[0], names),
    )
