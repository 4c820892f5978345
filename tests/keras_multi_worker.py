"""One worker of a `MultiWorkerMirroredStrategy` training with towerbench.keras.AdaScale
(tests/test_keras_adascale.py starts two, TF_CONFIG naming each). A custom loop
(`strategy.run`), because Keras 3's `fit` fails under this strategy whatever the optimizer
(keras-team/keras#20585, tensorflow/tensorflow#72388; seen here with TF 2.21, Keras 3.15). The
network's starting weights and the batches come from the files given; each step's gain, tau and
the trained weights go to stdout's last line as JSON.

    python keras_multi_worker.py WEIGHTS.npz BATCHES.npz GLOBAL_BATCH REFERENCE_BATCH LR
"""

import json
import sys

import keras
import numpy as np
import tensorflow as tf

from towerbench.model.keras_adascale import AdaScale


def network() -> keras.Model:
    """The tests' small MLP on 8x8x1 inputs, 10 logits."""
    return keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            keras.layers.Flatten(),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dense(10),
        ]
    )


def main(weights_file: str, batches_file: str, global_batch: int, reference_batch: int, lr: float):
    timeout = tf.distribute.experimental.CommunicationOptions(timeout_seconds=120)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=timeout)
    weights = np.load(weights_file)
    with strategy.scope():
        model = network()
        model.set_weights([weights[name] for name in sorted(weights.files, key=int)])
        optimizer = AdaScale(keras.optimizers.SGD(lr, momentum=0.9), reference_batch, global_batch)
        optimizer.build(model.trainable_variables)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

    @tf.function
    def step(images, labels):
        def replica_step(images, labels):
            with tf.GradientTape() as tape:
                # Each replica's loss: its sum over the global batch, as fit's (1/R of its mean).
                per_example = loss(labels, model(images, training=True))
                total = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
            grads = tape.gradient(total, model.trainable_variables)
            optimizer.apply(grads, model.trainable_variables)

        strategy.run(replica_step, args=(images, labels))

    batches = np.load(batches_file)
    data = tf.data.Dataset.from_tensor_slices((batches["images"], batches["labels"]))
    options = tf.data.Options()  # each worker takes its half of every global batch
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    gains = []
    for images, labels in strategy.experimental_distribute_dataset(
        data.batch(global_batch).with_options(options)
    ):
        step(images, labels)
        gains.append(float(optimizer.gain.numpy()))
    said = {
        "replicas": strategy.num_replicas_in_sync,
        "gains": gains,
        "tau": float(optimizer.progress.numpy()),
        "weights": [w.tolist() for w in model.get_weights()],
    }
    print(json.dumps(said))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]))
