"""The one place an optimizer is built: the configuration's optimizer with the hyperparameters its
scaling rule gives it (config/optimizers.py), on the LR schedule the caller made."""

from __future__ import annotations

import keras

from towerbench.config.optimizers import Hyperparameters, effective_hyperparameters
from towerbench.config.sections import TrainConfig
from towerbench.model.lars import LARS


def hyperparameters(config: TrainConfig) -> Hyperparameters:
    """`config`'s optimizer hyperparameters as its run uses them."""
    return effective_hyperparameters(
        config.optimizer,
        config.model_dump(),
        config.lr_scaling,
        config.global_batch / config.reference_batch,
        config.weight_decay,
    )


def l2_weight_decay(config: TrainConfig) -> float:
    """The L2 coefficient the loss carries: none when the optimizer decays the weights itself."""
    return 0.0 if hyperparameters(config).weight_decay is not None else config.weight_decay


def build_optimizer(config: TrainConfig, learning_rate) -> keras.optimizers.Optimizer:
    """`config.optimizer` on `learning_rate` (a float or a Keras LR schedule)."""
    values = hyperparameters(config)
    name = config.optimizer
    if name in ("sgd", "momentum", "nesterov"):
        momentum = 0.0 if name == "sgd" else values.momentum
        return keras.optimizers.SGD(learning_rate, momentum=momentum, nesterov=name == "nesterov")
    if name == "lars":
        return LARS(
            learning_rate,
            momentum=values.momentum,
            trust_coefficient=values.trust_coefficient,
            weight_decay=values.weight_decay,
            epsilon=values.epsilon,
        )
    if name == "rmsprop":
        return keras.optimizers.RMSprop(learning_rate, rho=values.rho, epsilon=values.epsilon)
    adam_like = {"beta_1": values.beta_1, "beta_2": values.beta_2, "epsilon": values.epsilon}
    if name == "adam":
        return keras.optimizers.Adam(learning_rate, **adam_like)
    if name == "adamw":
        return keras.optimizers.AdamW(learning_rate, weight_decay=values.weight_decay, **adam_like)
    return keras.optimizers.Lamb(learning_rate, weight_decay=values.weight_decay, **adam_like)
