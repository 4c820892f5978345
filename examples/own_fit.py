"""Take the recipe home: `towerbench.advise` finds the recipe for 4 towers, your own
`model.fit` under `tf.distribute.MirroredStrategy` trains with it.

    python examples/own_fit.py

1. `towerbench.advise` on the digits (64 pixel values a row, an MLP defined here) for 4 towers:
   a short probe, the recipe with a reason for each choice, kept in reports/advise-<id>.yaml.
2. `towerbench.sweep(params=that file)`: its verification in towerbench's trainer, 1 tower
   against the recipe's 4 towers for 3 seeds, each run in a process of its own (mlflow.db here).
3. The same recipe through your own training: `towerbench.keras.recipe(file)` gives the
   optimizer, batch, epochs and callbacks; `model.fit` runs on 4 replicas (4 logical CPU devices
   here; your GPUs where there are 4) for the same 3 seeds.
Each side's test accuracy over its seeds, with a 95% interval.
"""

import towerbench  # noqa: I001 - first: TensorFlow then starts without its C++ log lines

import keras
import numpy as np
import tensorflow as tf
from scipy import stats
from sklearn.datasets import load_digits

import towerbench.keras

TOWERS = 4
SEEDS = [0, 1, 2]


def replicas(towers: int) -> tf.distribute.MirroredStrategy:
    """One replica per GPU; without GPUs, the CPU split into `towers` logical devices (done
    before TensorFlow's runtime starts, so before anything else runs)."""
    if len(tf.config.list_physical_devices("GPU")) >= towers:
        return tf.distribute.MirroredStrategy([f"/gpu:{index}" for index in range(towers)])
    (cpu,) = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * towers
    )
    return tf.distribute.MirroredStrategy([f"/cpu:{index}" for index in range(towers)])


def build(input_shape, num_classes):
    """An MLP: one hidden layer of 64, logits out."""
    inputs = keras.Input(input_shape)
    x = keras.layers.Dense(64, activation="relu")(inputs)
    return keras.Model(inputs, keras.layers.Dense(num_classes)(x))


def digits_data(test: int = 497):
    """((x_train, y_train), (x_test, y_test)): 1,300 and 497 rows of 64 values in [0, 1]."""
    features, labels = load_digits(return_X_y=True)
    order = np.random.default_rng(0).permutation(len(labels))
    features, labels = (features[order] / 16).astype("float32"), labels[order].astype("int32")
    return (features[test:], labels[test:]), (features[:test], labels[:test])


def own_fit(strategy, recipe_file: str, data, seed: int) -> float:
    """Your training, with the recipe: its test accuracy."""
    (x_train, y_train), (x_test, y_test) = data
    keras.utils.set_random_seed(seed)
    with strategy.scope():  # the optimizer's variables live with the replicas
        recipe = towerbench.keras.recipe(recipe_file, train_examples=len(x_train))
        model = build(x_train.shape[1:], 10)
        model.compile(
            optimizer=recipe.optimizer,
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
    train = tf.data.Dataset.from_tensor_slices((x_train, y_train)).shuffle(len(x_train), seed)
    model.fit(
        train.batch(recipe.global_batch),
        epochs=recipe.epochs,
        callbacks=recipe.callbacks,
        shuffle=False,  # the dataset shuffles itself (seeded)
        verbose=0,
    )
    return model.evaluate(x_test, y_test, verbose=0, return_dict=True)["accuracy"]


def interval(accuracies: list[float]) -> str:
    """`0.9581 (95% CI [0.9443, 0.9719], 3 seeds)`: Student's t over the seeds."""
    mean = float(np.mean(accuracies))
    half = stats.t.ppf(0.975, len(accuracies) - 1) * stats.sem(accuracies)
    return f"{mean:.4f} (95% CI [{mean - half:.4f}, {mean + half:.4f}], {len(accuracies)} seeds)"


def main(seeds: list[int] = SEEDS) -> None:
    """Advise, verify in the trainer and fit with the recipe yourself, for `seeds` each."""
    strategy = replicas(TOWERS)  # first: devices are split before any TensorFlow op runs
    data = digits_data()
    common = dict(name="digits-fit", tracking_uri="sqlite:///mlflow.db", seeds=len(seeds))
    advice = towerbench.advise(
        model=build,
        data=data,
        towers=TOWERS,
        verify=False,
        optimizer="momentum",
        base_lr=0.05,
        reference_batch=16,  # base_lr is tuned for 1 tower of 16; 4 towers take 64
        global_batch=16,
        epochs=6,
        decay="constant",
        **common,
    )
    checked = towerbench.sweep(params=advice.params_file, tracking_uri=common["tracking_uri"])
    trainer = {
        towers: [c.test_accuracy for c in checked.configs if c.towers == towers]
        for towers in (1, TOWERS)
    }
    fitted = [own_fit(strategy, advice.params_file, data, seed) for seed in seeds]
    sides = {
        "1 tower, towerbench's trainer": trainer[1],
        f"{TOWERS} towers, the recipe, towerbench's trainer": trainer[TOWERS],
        f"{TOWERS} replicas, the recipe, your own fit": fitted,
    }
    for side, accuracies in sides.items():
        print(f"{side + ':':<48} test accuracy {interval(accuracies)}")


if __name__ == "__main__":
    main()
