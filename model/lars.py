"""LARS: layer-wise adaptive rate scaling (You, Gitman, Ginsburg 2017, arXiv 1708.03888).

Each variable w (a layer's kernel or bias) with gradient g gets its own learning rate, the
global one times its trust ratio
    lambda = eta * |w| / (|g| + beta * |w| + epsilon),
and the momentum update of the paper's Algorithm 1 with weight decay beta inside it:
    v <- m * v + lr * lambda * (g + beta * w),        w <- w - v.
eta is the trust coefficient, m the momentum, beta the (decoupled) weight decay. As in the
paper's reference implementation, a variable whose norm or whose gradient's norm is 0 (a bias
still at its initial zeros) takes a trust ratio of 1.
"""

from __future__ import annotations

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="towerbench")
class LARS(keras.optimizers.Optimizer):
    """SGD with momentum whose step for each variable is scaled by its trust ratio."""

    def __init__(
        self,
        learning_rate=0.1,
        momentum: float = 0.9,
        trust_coefficient: float = 0.001,
        weight_decay: float = 0.0,
        epsilon: float = 1e-7,
        name: str = "lars",
        **kwargs,
    ):
        # The weight decay is part of the trust ratio and the update, not Keras' separate step.
        super().__init__(learning_rate=learning_rate, name=name, **kwargs)
        self.momentum = momentum
        self.trust_coefficient = trust_coefficient
        self.decay = weight_decay
        self.epsilon = epsilon

    def build(self, variables):
        if self.built:
            return
        super().build(variables)
        self.velocities = self.add_optimizer_variables(variables, "velocity")

    def trust_ratio(self, gradient, variable):
        """eta |w| / (|g| + beta |w| + epsilon), or 1 when |w| or |g| is 0."""
        weight_norm = ops.norm(ops.reshape(variable, [-1]))
        gradient_norm = ops.norm(ops.reshape(gradient, [-1]))
        ratio = (
            self.trust_coefficient
            * weight_norm
            / (gradient_norm + self.decay * weight_norm + self.epsilon)
        )
        both = ops.logical_and(weight_norm > 0, gradient_norm > 0)
        return ops.where(both, ratio, ops.ones_like(ratio))

    def update_step(self, gradient, variable, learning_rate):
        learning_rate = ops.cast(learning_rate, variable.dtype)
        gradient = ops.cast(gradient, variable.dtype)
        velocity = self.velocities[self._get_variable_index(variable)]
        local_lr = learning_rate * self.trust_ratio(gradient, variable)
        step = local_lr * (gradient + self.decay * variable)
        self.assign(velocity, self.momentum * velocity + step)
        self.assign_sub(variable, velocity)

    def get_config(self):
        config = super().get_config()
        config.update(
            momentum=self.momentum,
            trust_coefficient=self.trust_coefficient,
            weight_decay=self.decay,
            epsilon=self.epsilon,
        )
        return config
