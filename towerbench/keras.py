"""Take the recipe home: what `towerbench advise` found, as Keras objects for your own
`model.fit` under `tf.distribute.MirroredStrategy` (docs/keras.md).

    import towerbench.keras

    recipe = towerbench.keras.recipe("reports/advise-1a2b3c4d.yaml", train_examples=50_000)
    with tf.distribute.MirroredStrategy().scope():
        model = build()
        model.compile(optimizer=recipe.optimizer, loss=..., metrics=[...])
    model.fit(train.batch(recipe.global_batch), epochs=recipe.epochs, callbacks=recipe.callbacks)

`AdaScale(optimizer, reference_batch=b0, global_batch=B)` wraps any Keras optimizer in AdaScale
(AdamScale for adaptive ones); `AdaScaleProgress` logs its gain and progress to History;
`NoiseScale(global_batch=B)` logs the gradient noise scale measured from the replicas.
Pure TensorFlow and Keras: importing it starts no Prefect, MLflow or DVC.
"""

from __future__ import annotations

from towerbench.config.recipe_file import Choice
from towerbench.model.keras_adascale import AdaScale, AdaScaleProgress
from towerbench.model.keras_noise_scale import NoiseScale
from towerbench.model.keras_recipe import KerasRecipe, StopAtStep, recipe

__all__ = [
    "AdaScale",
    "AdaScaleProgress",
    "Choice",
    "KerasRecipe",
    "NoiseScale",
    "StopAtStep",
    "recipe",
]
