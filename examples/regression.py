"""Regression from Python: does averaging 2 towers' gradients cost an MLP its MAE?

A tabular regression (scikit-learn's `make_regression`: 20 float features, 2 targets), trained
with the mean squared error and judged by the mean absolute error, lower is better:

    python examples/regression.py

The loss is a mean over examples, so 2 towers' averaged gradients are exactly the gradient of
their combined batch; the report says in MAE, with a 95% interval over the seeds, whether the 2
towers reached 1 tower (within report.margin: by default 1% of 1 tower's MAE).
"""

import towerbench  # noqa: I001 - first: TensorFlow then starts without its C++ log lines

import keras
from sklearn.datasets import make_regression


def build(input_shape, targets):
    """An MLP: two hidden layers of 64, one linear output per target."""
    inputs = keras.Input(input_shape)
    x = keras.layers.Dense(64, activation="relu")(inputs)
    x = keras.layers.Dense(64, activation="relu")(x)
    return keras.Model(inputs, keras.layers.Dense(targets)(x))


def regression_data(examples: int = 3000, test: int = 1000):
    """((x_train, y_train), (x_test, y_test)): float32 features and 2 float32 targets, the
    targets standardised with the training split's mean and deviation (MAE in deviations)."""
    features, targets = make_regression(
        n_samples=examples + test, n_features=20, n_informative=10, n_targets=2, noise=10.0,
        random_state=0,
    )  # fmt: skip
    mean, deviation = targets[:examples].mean(0), targets[:examples].std(0)
    features, targets = features.astype("float32"), ((targets - mean) / deviation).astype("float32")
    return (features[:examples], targets[:examples]), (features[examples:], targets[examples:])


if __name__ == "__main__":
    # Prints a line as each run ends (its test MAE), the results, the verdicts and the report.
    towerbench.sweep(
        model=build,
        data=regression_data(),
        name="regression",
        loss="mse",
        metric="mae",
        towers=[1, 2],
        seeds=[0, 1],
        optimizer="adam",
        epochs=5,
        global_batch=64,
        tracking_uri="sqlite:///mlflow.db",
    )
