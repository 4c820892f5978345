"""Multi-label tags from Python: does averaging 2 towers' gradients cost a tagger its accuracy?

Each example carries any number of 5 tags (scikit-learn's `make_multilabel_classification`,
multi-hot rows of 0/1), trained with binary cross-entropy on logits (one sigmoid per tag, applied
by the loss) and judged by binary accuracy: each tag's logit sign against its 0/1 label,
averaged over tags and examples:

    python examples/multilabel.py
"""

import towerbench  # noqa: I001 - first: TensorFlow then starts without its C++ log lines

import keras
from sklearn.datasets import make_multilabel_classification


def build(input_shape, tags):
    """An MLP: two hidden layers of 64, one logit per tag (no activation: the loss applies it)."""
    inputs = keras.Input(input_shape)
    x = keras.layers.Dense(64, activation="relu")(inputs)
    x = keras.layers.Dense(64, activation="relu")(x)
    return keras.Model(inputs, keras.layers.Dense(tags)(x))


def tagged_data(examples: int = 3000, test: int = 1000):
    """((x_train, y_train), (x_test, y_test)): float32 word counts, scaled by the training
    split's deviation, and multi-hot rows of 5 tags."""
    features, tags = make_multilabel_classification(
        n_samples=examples + test, n_features=20, n_classes=5, n_labels=2, random_state=0
    )
    features = (features / features[:examples].std(0)).astype("float32")
    return (features[:examples], tags[:examples]), (features[examples:], tags[examples:])


if __name__ == "__main__":
    # Prints a line as each run ends (its test binary accuracy), the verdicts and the report.
    towerbench.sweep(
        model=build,
        data=tagged_data(),
        name="tags",
        loss="binary_crossentropy",
        towers=[1, 2],
        seeds=[0, 1],
        optimizer="adam",
        epochs=5,
        global_batch=64,
        tracking_uri="sqlite:///mlflow.db",
    )
