"""A recipe `towerbench advise` wrote, as Keras objects for a user's own `model.fit` under
`tf.distribute.MirroredStrategy` (or `MultiWorkerMirroredStrategy`): the optimizer with the
recipe's scaled LR, warmup and decay as a Keras schedule and its hyperparameters after the
scaling rule, the epochs its budget gives, the global batch, and the callbacks it needs.

The optimizer is built exactly as the trainer builds the recipe's K-tower run (the same
TrainConfig from the recipe file's sweep, model.optimizers.build_optimizer, the schedule counted
in the same steps per epoch), so a `fit` that feeds it batches of `global_batch` examples
follows the LR the trainer followed at every step.
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
from towerbench.config.recipe_file import RecipeChoice, recipe_choices
from towerbench.config.sections import TrainConfig
from towerbench.core.errors import TowerbenchError
from towerbench.model.input_pipeline import EpochPlan
from towerbench.model.optimizers import build_optimizer
from towerbench.model.schedules import keras_schedule, schedule_from_config


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
    given (optimizer, scaling, warmup epochs, budget, schedule). `config` is the K-tower run
    the trainer verifies, `learning_rate` its schedule in optimizer steps."""

    config: TrainConfig
    learning_rate: float | keras.optimizers.schedules.LearningRateSchedule
    epochs: int
    steps: int
    steps_per_epoch: int
    global_batch: int
    replicas: int
    callbacks: list[keras.callbacks.Callback]
    reasons: dict[str, RecipeChoice]
    advise_run_id: str
    notes: list[str] = field(default_factory=list)

    @cached_property
    def optimizer(self) -> keras.optimizers.Optimizer:
        """The recipe's optimizer, built where it is first asked for: inside
        `strategy.scope()`, as Keras needs for its variables."""
        return build_optimizer(self.config, self.learning_rate)

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
    if config.lr_scaling == "adascale":
        raise TowerbenchError(
            f"{path}: an adascale recipe needs towerbench.keras.AdaScale, not yet exported"
        )
    learning_rate = keras_schedule(schedule_from_config(config), plan.steps)
    steps = max(round(config.epochs * plan.steps), 1)
    epochs = math.ceil(steps / plan.steps)
    callbacks: list[keras.callbacks.Callback] = []
    notes: list[str] = []
    if steps != epochs * plan.steps:
        callbacks.append(StopAtStep(steps))
        notes.append(
            f"StopAtStep({steps}): the budget is {config.epochs:g} epochs, fit counts whole ones"
        )
    if config.l2_weight_decay and config.model in BUILTIN_MODELS:
        notes.append(
            f"weight decay {config.l2_weight_decay:g} on tf.nn.l2_loss of {config.model}'s "
            "kernels: in your model, keras.regularizers.L2("
            f"{config.l2_weight_decay / 2:g}) on the same kernels"
        )
    return KerasRecipe(
        config=config,
        learning_rate=learning_rate,
        epochs=epochs,
        steps=steps,
        steps_per_epoch=plan.steps,
        global_batch=config.global_batch,
        replicas=config.replicas,
        callbacks=callbacks,
        reasons=reasons,
        advise_run_id=run_id,
        notes=notes,
    )


def _recipe_run(path: Path) -> TrainConfig:
    """The run the recipe is for: the K-tower run its verification trains, first seed."""
    params = load(path, resolve_tracking=False)
    scaled = [run for run in verification_configs(params.train, params.sweep) if run.replicas > 1]
    if not scaled:
        raise TowerbenchError(f"{path}: its sweep has no run on several towers to take home")
    return scaled[0]
