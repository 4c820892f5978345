"""Retrieval from Python: a two-tower model trained with in-batch negatives, judged by recall@10.

Synthetic user–item interactions: 300 users and 200 items, each described by 16 features that
hide an 8-number taste; a user picks items whose taste matches theirs. Each example is one
interaction, its features the user's and the item's side by side, its label the item's id:

    python examples/retrieval.py

The model returns (batch, 2, d), the user's embedding and the item's. `in_batch_softmax` scores
every user against the items of its batch, so with k towers each softmax sees only its tower's
B/k items: an easier objective than the big batch's, not the same one. recall@10 ranks every
test user against the same 200 test items on one device, whatever the towers.
"""

import towerbench  # noqa: I001 - first: TensorFlow then starts without its C++ log lines

import keras
import numpy as np

SIDE = 16  # features per user and per item


def build(input_shape, items):
    """Two towers of the same shape: the user's features and the item's, each to a 32-number
    embedding; `items` (the number of item ids) is not needed, the items being described by
    their features."""
    inputs = keras.Input(input_shape)

    def tower(features, name):
        x = keras.layers.Dense(64, activation="relu", name=f"{name}_hidden")(features)
        return keras.layers.Dense(32, name=f"{name}_embedding")(x)

    user = tower(inputs[:, :SIDE], "user")
    item = tower(inputs[:, SIDE:], "item")
    return keras.Model(inputs, keras.ops.stack([user, item], axis=1))


def interactions(examples: int = 6000, test: int = 2000, seed: int = 0):
    """((x_train, y_train), (x_test, y_test)): float32 features (the user's, then the item's)
    and int item ids; each user picks an item with probability softmax(3 · taste · taste')."""
    rng = np.random.default_rng(seed)
    user_taste, item_taste = rng.normal(size=(300, 8)), rng.normal(size=(200, 8))
    mixing = rng.normal(size=(8, SIDE)) / np.sqrt(8)
    user_features = user_taste @ mixing + 0.1 * rng.normal(size=(300, SIDE))
    item_features = item_taste @ mixing + 0.1 * rng.normal(size=(200, SIDE))
    users = rng.integers(0, 300, examples + test)
    affinity = 3 * user_taste[users] @ item_taste.T / np.sqrt(8)
    chance = np.exp(affinity - affinity.max(1, keepdims=True))
    chance /= chance.sum(1, keepdims=True)
    items = np.array([rng.choice(200, p=row) for row in chance])
    x = np.concatenate([user_features[users], item_features[items]], 1).astype("float32")
    return (x[:examples], items[:examples]), (x[examples:], items[examples:])


if __name__ == "__main__":
    # Prints a line as each run ends (its test recall@10), the results, the verdicts and the report.
    towerbench.sweep(
        model=build,
        data=interactions(),
        name="retrieval",
        loss="in_batch_softmax",
        metric="recall_at_10",
        towers=[1, 4],
        seeds=[0, 1],
        optimizer="adam",
        epochs=5,
        global_batch=128,
        tracking_uri="sqlite:///mlflow.db",
    )
