"""The one place an optimizer is built: the configuration's optimizer with the hyperparameters its
scaling rule gives it (config/optimizers.py), on the LR schedule the caller made."""

from __future__ import annotations

import keras

from towerbench.config.sections import TrainConfig
from towerbench.core.errors import TowerbenchError
from towerbench.model.lars import LARS

# Each optimizer's class; its hyperparameters' names are the class's keyword arguments.
OPTIMIZER_CLASSES: dict[str, type[keras.optimizers.Optimizer]] = {
    "sgd": keras.optimizers.SGD,
    "momentum": keras.optimizers.SGD,
    "nesterov": keras.optimizers.SGD,
    "lars": LARS,
    "adam": keras.optimizers.Adam,
    "adamw": keras.optimizers.AdamW,
    "rmsprop": keras.optimizers.RMSprop,
    "lamb": keras.optimizers.Lamb,
}


def check_weight_decay_once(model: keras.Model, config: TrainConfig) -> None:
    """Refuse a model whose own regularizers add L2 to the loss beside an optimizer that decays
    the weights itself (adamw, lamb, lars with weight_decay > 0): they would decay twice."""
    if config.l2_weight_decay or not config.weight_decay:
        return
    regularized = [v.path for v in model.trainable_variables if getattr(v, "regularizer", None)]
    if regularized:
        raise TowerbenchError(
            f"{config.model}: --optimizer {config.optimizer} decays the weights itself (weight "
            f"decay {config.weight_decay:g}) and the model's regularizers ({regularized[0]}"
            f"{', ...' if len(regularized) > 1 else ''}) add L2 to the loss: they would decay "
            "twice; set --weight-decay 0 to keep the regularizers, or remove them"
        )


def build_optimizer(
    config: TrainConfig, learning_rate, **keras_options: object
) -> keras.optimizers.Optimizer:
    """`config.optimizer` on `learning_rate` (a float or a Keras LR schedule); `keras_options`
    are the Keras optimizer's own (e.g. `use_ema`)."""
    arguments: dict[str, object] = {**config.optimizer_hyperparameters().items(), **keras_options}
    if config.optimizer == "nesterov":
        arguments["nesterov"] = True
    return OPTIMIZER_CLASSES[config.optimizer](learning_rate, **arguments)
