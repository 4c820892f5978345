"""The optimizers a run can use, which hyperparameters each takes, and what a batch-size scaling
rule does to them.

Two families. SGD-like (`sgd`, `momentum`, `nesterov`, and LARS, You et al. 2017) take an update
proportional to the gradient: the linear rule (Goyal et al. 2017) scales their LR by
kappa = global_batch / reference_batch. Adaptive ones (`adam`, `adamw`, `rmsprop`, and LAMB,
You et al. 2019) divide by a running gradient second moment: their SDE scaling rule is the
square-root rule of Malladi et al. 2022, which at kappa times the batch takes
    LR x sqrt(kappa),  1 - beta_1 and 1 - beta_2 (rmsprop: 1 - rho) x kappa,  epsilon / sqrt(kappa),
and AdaScale's gain enters them to the power 1/2 (AdaptDL's AdamScale).

Weight decay. For `adamw`, `lamb` and `lars`, `weight_decay` is the optimizer's own decoupled
decay (Loshchilov & Hutter 2019; LAMB's and LARS' weight decay term): the loss gets no L2 term.
For the others it is the L2 coefficient on tf.nn.l2_loss(w) added to the loss, once per step.

Plain Python: the config, the report and MLflow params read it without TensorFlow.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

OptimizerName = Literal["sgd", "momentum", "nesterov", "lars", "adam", "adamw", "rmsprop", "lamb"]
OPTIMIZERS: tuple[OptimizerName, ...] = (
    "sgd",
    "momentum",
    "nesterov",
    "lars",
    "adam",
    "adamw",
    "rmsprop",
    "lamb",
)
ADAPTIVE: frozenset[str] = frozenset({"adam", "adamw", "rmsprop", "lamb"})
DECOUPLED_WEIGHT_DECAY: frozenset[str] = frozenset({"adamw", "lamb", "lars"})
LAYER_WISE: frozenset[str] = frozenset({"lars", "lamb"})

# The hyperparameter fields of the training configuration each optimizer reads.
HYPERPARAMETERS: dict[str, frozenset[str]] = {
    "sgd": frozenset(),
    "momentum": frozenset({"momentum"}),
    "nesterov": frozenset({"momentum"}),
    "lars": frozenset({"momentum", "trust_coefficient", "epsilon"}),
    "adam": frozenset({"beta_1", "beta_2", "epsilon"}),
    "adamw": frozenset({"beta_1", "beta_2", "epsilon"}),
    "rmsprop": frozenset({"rho", "epsilon"}),
    "lamb": frozenset({"beta_1", "beta_2", "epsilon"}),
}
ALL_HYPERPARAMETERS: frozenset[str] = frozenset().union(*HYPERPARAMETERS.values())

# An explicit optimizer brings its own default learning rate (Keras' 0.001 for the adaptive
# ones) unless the user gives base_lr; presets' LRs are tuned for their own optimizer. LARS
# moves each layer's weights by about lr x trust_coefficient of their norm per step: 10 x 0.001,
# 1%. Measured here (digits, tutorial, 2 towers of 16, 4 epochs): LR 10 55.7%, LR 40 91.1%.
DEFAULT_LEARNING_RATES: dict[str, float] = {
    "lars": 10.0,
    "adam": 0.001,
    "adamw": 0.001,
    "rmsprop": 0.001,
    "lamb": 0.001,
}


def family(optimizer: str) -> Literal["sgd", "adaptive"]:
    """Which scaling rules fit `optimizer`: the SGD family's or the adaptive one's."""
    return "adaptive" if optimizer in ADAPTIVE else "sgd"


def adascale_power(optimizer: str) -> float:
    """The power of AdaScale's gain in the LR: 1 for SGD-like optimizers, 1/2 for adaptive ones
    (AdamScale)."""
    return 0.5 if optimizer in ADAPTIVE else 1.0


@dataclass(frozen=True)
class Hyperparameters:
    """An optimizer's hyperparameters as a run uses them (after its scaling rule)."""

    optimizer: str
    momentum: float | None = None
    beta_1: float | None = None
    beta_2: float | None = None
    rho: float | None = None
    epsilon: float | None = None
    trust_coefficient: float | None = None
    weight_decay: float | None = None  # decoupled: the optimizer's own

    def items(self) -> dict[str, float]:
        """The values the optimizer takes, by field name (MLflow logs them as effective.*)."""
        names = (*sorted(HYPERPARAMETERS[self.optimizer]), "weight_decay")
        values = {name: getattr(self, name) for name in names}
        return {name: value for name, value in values.items() if value is not None}

    def describe(self) -> str:
        """`adam (beta_1 0.6, beta_2 0.996, epsilon 5e-08)`."""
        values = ", ".join(f"{name} {value:.4g}" for name, value in self.items().items())
        return f"{self.optimizer} ({values})" if values else self.optimizer


def _sqrt_rule_beta(beta: float, kappa: float) -> float:
    """beta with 1 - beta scaled by kappa, kept a valid moving-average factor (>= 0)."""
    return max(1.0 - kappa * (1.0 - beta), 0.0)


def effective_hyperparameters(
    optimizer: str,
    values: dict[str, float],
    lr_scaling: str,
    kappa: float,
    weight_decay: float,
) -> Hyperparameters:
    """`optimizer`'s hyperparameters from `values` (the configuration's fields), adjusted by the
    square-root rule when `lr_scaling` is sqrt and the optimizer adaptive (kappa = global batch
    / reference batch); `weight_decay` is kept when the optimizer decouples it."""
    taken = {name: values[name] for name in HYPERPARAMETERS[optimizer]}
    if lr_scaling == "sqrt" and optimizer in ADAPTIVE:
        for name in ("beta_1", "beta_2", "rho"):
            if name in taken:
                taken[name] = _sqrt_rule_beta(taken[name], kappa)
        taken["epsilon"] = taken["epsilon"] / math.sqrt(kappa)
    decoupled = weight_decay if optimizer in DECOUPLED_WEIGHT_DECAY else None
    return Hyperparameters(optimizer=optimizer, weight_decay=decoupled, **taken)
