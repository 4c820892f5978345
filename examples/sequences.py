"""Token ids from Python: does averaging 2 towers' gradients cost a GRU text classifier accuracy?

Synthetic "documents" of 30 token ids (int32, a rank-2 array) from a vocabulary of 200, where
each of 3 classes draws a fifth of its tokens from words of its own; an Embedding and a GRU read
them. Run it from a script or a notebook:

    python examples/sequences.py
"""

import towerbench  # noqa: I001 - first: TensorFlow then starts without its C++ log lines

import keras
import numpy as np

VOCABULARY = 200
LENGTH = 30
CLASSES = 3


def build(input_shape, num_classes):
    """Embedding (200 ids -> 16), a GRU of 32 units, logits out."""
    inputs = keras.Input(input_shape, dtype="int32")
    x = keras.layers.Embedding(VOCABULARY, 16)(inputs)
    x = keras.layers.GRU(32)(x)
    return keras.Model(inputs, keras.layers.Dense(num_classes)(x))


def token_data(examples: int = 2000, test: int = 500, seed: int = 0):
    """((x_train, y_train), (x_test, y_test)): int32 ids of shape (N, 30), labels 0-2."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, CLASSES, size=examples + test)
    tokens = rng.integers(CLASSES * 10, VOCABULARY, size=(examples + test, LENGTH))
    own_words = rng.random((examples + test, LENGTH)) < 0.2  # class c's words: 10c .. 10c+9
    tokens = np.where(own_words, labels[:, None] * 10 + rng.integers(0, 10, tokens.shape), tokens)
    tokens = tokens.astype(np.int32)
    return (tokens[:examples], labels[:examples]), (tokens[examples:], labels[examples:])


if __name__ == "__main__":
    # Prints a line as each run ends, then the results, the verdicts and where the report is.
    towerbench.sweep(
        model=build,
        data=token_data(),
        name="tokens",
        towers=[1, 2],
        seeds=[0, 1],
        optimizer="adam",
        epochs=3,
        global_batch=64,
        tracking_uri="sqlite:///mlflow.db",
    )
