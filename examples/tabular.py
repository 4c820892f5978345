"""Tabular data from Python: does averaging 2 towers' gradients cost an MLP accuracy?

The question in five lines, from a script or a notebook, on arrays (here scikit-learn's
`make_classification`: 20 float features, 4 classes) and a network defined right here:

    python examples/tabular.py

towerbench writes the arrays once as a dataset (DATA_DIR/raw/<name>/), trains 1 and 2 towers with
Adam for each seed, each in a process of its own tracked in MLflow (mlflow.db here), and reports.
"""

import towerbench  # noqa: I001 - first: TensorFlow then starts without its C++ log lines

import keras
from sklearn.datasets import make_classification


def build(input_shape, num_classes):
    """An MLP: two hidden layers of 64, logits out (towerbench applies the softmax)."""
    inputs = keras.Input(input_shape)
    x = keras.layers.Dense(64, activation="relu")(inputs)
    x = keras.layers.Dense(64, activation="relu")(x)
    return keras.Model(inputs, keras.layers.Dense(num_classes)(x))


def tabular_data(examples: int = 3000, test: int = 1000):
    """((x_train, y_train), (x_test, y_test)) of float32 features and integer labels."""
    features, labels = make_classification(
        n_samples=examples + test, n_features=20, n_informative=10, n_classes=4, random_state=0
    )
    features = features.astype("float32")
    return (features[:examples], labels[:examples]), (features[examples:], labels[examples:])


if __name__ == "__main__":
    # Prints a line as each run ends, then the results, the verdicts and where the report is.
    towerbench.sweep(
        model=build,
        data=tabular_data(),
        name="tabular",
        towers=[1, 2],
        seeds=[0, 1],
        optimizer="adam",
        epochs=5,
        global_batch=64,
        tracking_uri="sqlite:///mlflow.db",
    )
