"""Weight decay and the model's own weight regularizers, added once a step after the towers'
gradients are combined (Goyal et al. 2017, remark 1)."""

from __future__ import annotations

import tensorflow as tf

from towerbench.model.networks import Network


class WeightDecay:
    """weight_decay x the sum of tf.nn.l2_loss(w) over the network's decayed variables, plus
    its variables' `regularizer`s (a user's kernel_regularizer)."""

    def __init__(self, network: Network, weight_decay: float):
        self.weight_decay = weight_decay
        self.trainable = list(network.model.trainable_variables)
        decayed = {id(variable) for variable in network.decayed_variables}
        self.decayed_mask = [id(variable) in decayed for variable in self.trainable]
        self.regularizers = [getattr(v, "regularizer", None) for v in self.trainable]

    def loss(self) -> tf.Tensor:
        """The penalty, differentiable with respect to the variables (what a reference
        computation differentiates)."""
        terms = [
            self.weight_decay * tf.nn.l2_loss(variable)
            for variable, decayed in zip(self.trainable, self.decayed_mask, strict=True)
            if decayed
        ]
        terms += [
            tf.cast(regularizer(variable), tf.float32)
            for variable, regularizer in zip(self.trainable, self.regularizers, strict=True)
            if regularizer is not None
        ]
        return tf.add_n(terms) if terms else tf.constant(0.0)

    def terms(self) -> tuple[tf.Tensor, list[tf.Tensor | None]]:
        """(the penalty, its gradient per variable): weight_decay x w in closed form, each
        regularizer's gradient by differentiation; None where a variable has neither."""
        terms: list[tf.Tensor | None] = []
        l2_losses = [tf.constant(0.0)]
        for variable, decayed in zip(self.trainable, self.decayed_mask, strict=True):
            terms.append(self.weight_decay * variable.value if decayed else None)
            if decayed:
                l2_losses.append(tf.nn.l2_loss(variable.value))
        decay = self.weight_decay * tf.add_n(l2_losses)
        if not any(r is not None for r in self.regularizers):
            return decay, terms
        values = [variable.value for variable in self.trainable]
        with tf.GradientTape() as tape:
            tape.watch(values)
            regularization = tf.add_n(
                [
                    tf.cast(regularizer(value), tf.float32)
                    for value, regularizer in zip(values, self.regularizers, strict=True)
                    if regularizer is not None
                ]
            )
        gradients = tape.gradient(regularization, values)
        for index, gradient in enumerate(gradients):
            if self.regularizers[index] is not None:
                terms[index] = gradient if terms[index] is None else terms[index] + gradient
        return decay + regularization, terms
