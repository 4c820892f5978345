"""A recipe `towerbench advise` wrote, as Keras objects for a user's own `model.fit` under
`tf.distribute.MirroredStrategy`: the optimizer with the recipe's scaled LR, warmup and decay
as a Keras schedule and its hyperparameters after the scaling rule, the epochs its budget
gives, the global batch, and the callbacks it needs.

The optimizer is built exactly as the trainer builds the recipe's K-tower run (the same
TrainConfig from the recipe file's sweep, model.optimizers.build_optimizer, the schedule counted
in the same steps per epoch), so a `fit` that feeds it batches of `global_batch` examples
follows the LR the trainer followed at every step. Under `lr_scaling: adascale` it is wrapped in
AdaScale (model/keras_adascale.py) over the reference batch's schedule, and AdaScaleProgress
ends `fit` at the trainer's budget of progress.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import keras

from towerbench.config.advise import verification_configs
from towerbench.config.load import load
from towerbench.config.model_ref import BUILTIN_MODELS
from towerbench.config.optimizers import adascale_power
from towerbench.config.recipe_file import Choice, recipe_choices
from towerbench.config.sections import TrainConfig
from towerbench.core.errors import TowerbenchError
from towerbench.model.adascale import (
    ScaleInvariantBudget,
    reference_schedule,
    reference_steps_per_epoch,
)
from towerbench.model.batch_norm_statistics import scale_batch_norm_momentum
from towerbench.model.input_pipeline import EpochPlan
from towerbench.model.keras_adascale import AdaScale, AdaScaleProgress
from towerbench.model.optimizers import build_optimizer
from towerbench.model.schedules import StepSchedule, keras_schedule, schedule_from_config


class StopAtStep(keras.callbacks.Callback):
    """Ends `fit` once the optimizer has made `steps` steps: a budget of fractional epochs."""

    def __init__(self, steps: int):
        super().__init__()
        self.steps = steps

    def on_train_batch_end(self, batch, logs=None):
        del batch, logs
        if int(self.model.optimizer.iterations.numpy()) >= self.steps:
            self.model.stop_training = True


@dataclass(frozen=True)
class KerasRecipe:
    """The recipe for `model.compile(optimizer=...)` and `model.fit(epochs=..., callbacks=...)`
    on batches of `global_batch` examples; `reasons` holds each choice of the advice as it was
    given (optimizer, scaling, warmup epochs, budget, schedule, and since BatchNorm's lag is
    measured its statistics). `config` is the K-tower run
    the trainer verifies, `learning_rate` its schedule in optimizer steps."""

    config: TrainConfig
    learning_rate: float | keras.optimizers.schedules.LearningRateSchedule
    epochs: int  # whole epochs for fit; the callbacks end it at `steps` (adascale: at tau)
    steps: int
    steps_per_epoch: int
    callbacks: list[keras.callbacks.Callback]
    reasons: dict[str, Choice]
    advise_run_id: str
    notes: list[str] = field(default_factory=list)

    @property
    def global_batch(self) -> int:
        """Examples a step: batch your dataset with it."""
        return self.config.global_batch

    @property
    def replicas(self) -> int:
        """The towers over all workers the recipe is for."""
        return self.config.replicas

    @cached_property
    def optimizer(self) -> keras.optimizers.Optimizer:
        """The recipe's optimizer, built where it is first asked for: inside
        `strategy.scope()`, as Keras needs for its variables."""
        optimizer = build_optimizer(self.config, self.learning_rate)
        if self.config.lr_scaling != "adascale":
            return optimizer
        return AdaScale(
            optimizer,
            self.config.reference_batch,
            self.config.global_batch,
            power=adascale_power(self.config.optimizer),
        )

    def scale_batch_norm(self, model: keras.Model) -> None:
        """Under the recipe's EMA rule, each BatchNorm layer of `model` gets momentum m**k as
        the trainer's did (call it before `fit`); otherwise nothing changes."""
        if self.config.ema_scale != 1.0:
            scale_batch_norm_momentum(model, self.config.scaled_momentum)

    def lines(self) -> list[str]:
        """What the recipe sets, and why: one line each."""
        said = [
            f"global batch {self.global_batch} over {self.replicas} replicas, "
            f"{self.steps_per_epoch} steps an epoch",
            f"epochs {self.epochs} ({self.steps:,} optimizer steps)",
        ]
        said += [f"{name}: {c.value} — {c.reason}" for name, c in self.reasons.items()]
        return said + self.notes


def recipe(params_file: str | Path, train_examples: int) -> KerasRecipe:
    """The recipe file `params_file` (`advise-<id>.yaml`) for a `fit` over `train_examples`
    training examples an epoch."""
    path = Path(params_file)
    run_id, reasons = recipe_choices(path)
    if isinstance(train_examples, bool) or not isinstance(train_examples, int):
        raise TowerbenchError(f"train_examples: a whole number of examples, got {train_examples!r}")
    if train_examples < 1:
        raise TowerbenchError(f"train_examples: at least 1 example, got {train_examples}")
    config = _recipe_run(path)
    plan = EpochPlan(train_examples, config.global_batch, config.replicas, config.workers)
    budget = (
        _adascale_budget(config, plan, train_examples)
        if config.lr_scaling == "adascale"
        else _epochs_budget(config, plan)
    )
    if config.l2_weight_decay and config.model in BUILTIN_MODELS:
        budget.notes.append(
            f"weight decay {config.l2_weight_decay:g} on tf.nn.l2_loss of {config.model}'s "
            "kernels: in your model, keras.regularizers.L2("
            f"{config.l2_weight_decay / 2:g}) on the same kernels"
        )
    if config.ema_scaling == "ema_rule":
        budget.notes.append(
            f"the EMA rule: recipe.scale_batch_norm(model) before fit raises each BatchNorm "
            f"momentum m to m**{config.ema_scale:g}, as the trainer's run did"
        )
    if config.eval_bn == "recomputed":
        budget.notes.append(
            "the verification judged it with BatchNorm statistics re-estimated at the weights; "
            "Keras' evaluate uses the moving ones"
        )
    return KerasRecipe(
        config=config,
        learning_rate=budget.learning_rate,
        epochs=math.ceil(budget.steps / plan.steps),
        steps=budget.steps,
        steps_per_epoch=plan.steps,
        callbacks=budget.callbacks,
        reasons=reasons,
        advise_run_id=run_id,
        notes=budget.notes,
    )


@dataclass(frozen=True)
class _Budget:
    """The LR a recipe's optimizer follows, the steps it makes (at most, under adascale), and
    the callbacks that end `fit` there, each with a note."""

    learning_rate: float | keras.optimizers.schedules.LearningRateSchedule
    steps: int
    callbacks: list[keras.callbacks.Callback]
    notes: list[str]


def _epochs_budget(config: TrainConfig, plan: EpochPlan) -> _Budget:
    """The configured epochs' steps, the schedule counted in them; StopAtStep when they are
    not whole epochs."""
    steps = max(round(config.epochs * plan.steps), 1)
    learning_rate = keras_schedule(schedule_from_config(config), plan.steps)
    if steps % plan.steps == 0:
        return _Budget(learning_rate, steps, [], [])
    note = f"StopAtStep({steps}): the budget is {config.epochs:g} epochs, fit counts whole ones"
    return _Budget(learning_rate, steps, [StopAtStep(steps)], [note])


def _adascale_budget(config: TrainConfig, plan: EpochPlan, examples: int) -> _Budget:
    """The reference batch's schedule in its own steps (AdaScale reads it at tau), and
    AdaScaleProgress ending `fit` when tau reaches the reference's steps."""
    reference = reference_schedule(config.base_lr, schedule_from_config(config))
    # Read at a fractional tau, as the trainer reads it: Keras' own schedules assume whole steps.
    learning_rate = StepSchedule(
        reference, reference_steps_per_epoch(examples, config.reference_batch)
    )
    budget = ScaleInvariantBudget.of(
        config.epochs, examples, config.reference_batch, config.global_batch
    )
    steps = budget.reference_steps
    note = (
        f"AdaScaleProgress({steps}): AdaScale ends when its progress tau reaches the reference's "
        f"{steps:,} steps, after {math.ceil(steps / budget.max_gain):,} to {steps:,} steps at "
        f"batch {config.global_batch}"
    )
    return _Budget(learning_rate, steps, [AdaScaleProgress(steps)], [note])


def _recipe_run(path: Path) -> TrainConfig:
    """The run the recipe is for: the K-tower run its verification trains, first seed."""
    params = load(path, resolve_tracking=False)
    scaled = [run for run in verification_configs(params.train, params.sweep) if run.replicas > 1]
    if not scaled:
        raise TowerbenchError(f"{path}: its sweep has no run on several towers to take home")
    return scaled[0]
