"""In-batch negatives (issue 62 item 1): `in_batch_softmax` against values computed by hand,
recall@K on one fixed set of test candidates, the metric and loss choices that fit it, and a
model whose output is not (batch, 2, d) refused in one line."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import fixtures_model
import fixtures_user
import keras
import numpy as np
import pytest
import tensorflow as tf

from towerbench.config.metrics import resolved_metric
from towerbench.config.sections import TrainConfig
from towerbench.core.errors import TowerbenchError
from towerbench.core.metrics import METRICS
from towerbench.core.tfrecord_format import dataset_dir, load_manifest, split_files
from towerbench.ingest.write_records import write_dataset
from towerbench.model.evaluation import Evaluator
from towerbench.model.losses import MASKED_LOGIT, per_example_loss
from towerbench.model.metric_values import fixed_candidates, retrieval
from towerbench.model.training_data import check_config_against_data
from towerbench.model.user_model import check_model

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
RNG = np.random.default_rng(3)
PAIRS = RNG.normal(size=(4, 2, 3)).astype(np.float32)  # 4 examples: query, candidate; d = 3
IDS = np.array([7, 2, 7, 5], np.int32)  # examples 0 and 2 share their candidate


def _dot(a, b) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


def _by_hand(pairs, ids, temperature: float) -> list[float]:
    """Each query's cross-entropy among the batch's candidates, the others of its own id left
    out, one number at a time."""
    losses = []
    for i, (query, _) in enumerate(pairs.tolist()):
        logits = [
            _dot(query, candidate) / temperature
            for j, (_, candidate) in enumerate(pairs.tolist())
            if j == i or ids[j] != ids[i]
        ]
        own = _dot(query, pairs[i, 1].tolist()) / temperature
        losses.append(math.log(sum(math.exp(v) for v in logits)) - own)
    return losses


@pytest.mark.parametrize("temperature", [1.0, 0.2])
def test_in_batch_softmax_matches_its_definition_computed_by_hand(temperature):
    computed = per_example_loss("in_batch_softmax", temperature)(IDS, PAIRS).numpy()
    assert computed.shape == (4,)
    np.testing.assert_allclose(computed, _by_hand(PAIRS, IDS, temperature), rtol=1e-5)


def test_an_accidental_hit_is_masked_and_leaves_no_nan_in_the_gradient():
    pairs = tf.Variable(PAIRS)
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(per_example_loss("in_batch_softmax")(IDS, pairs))
    gradient = tape.gradient(loss, pairs).numpy()
    assert np.all(np.isfinite(gradient))
    # Unmasked, example 2's candidate would be one of example 0's negatives: a different loss.
    unmasked = per_example_loss("in_batch_softmax")(np.arange(4, dtype=np.int32), PAIRS)
    assert float(unmasked[0]) > float(per_example_loss("in_batch_softmax")(IDS, PAIRS)[0])
    assert MASKED_LOGIT < -1e30


def test_a_towers_share_of_the_batch_gives_each_query_fewer_candidates():
    """The loss is not a mean over examples: half a batch gives each query other candidates."""
    whole = per_example_loss("in_batch_softmax")(IDS, PAIRS).numpy()
    halves = np.concatenate(
        [
            per_example_loss("in_batch_softmax")(IDS[s], PAIRS[s]).numpy()
            for s in (slice(0, 2), slice(2, 4))
        ]
    )
    assert np.all(halves < whole)


def _ranked_by_hand(ids, pairs, k: int, limit: int) -> tuple[float, float, int]:
    """recall@k and the loss over the first `limit` distinct ids' first examples, one query at a
    time; a tie shares its place at random."""
    chosen: dict[int, int] = {}
    for index, candidate_id in enumerate(ids.tolist()):
        if candidate_id not in chosen and len(chosen) < limit:
            chosen[candidate_id] = index
    hits, losses = [], []
    for query_index, candidate_id in enumerate(ids.tolist()):
        if candidate_id not in chosen:
            continue
        scores = {c: _dot(pairs[query_index, 0], pairs[i, 1]) for c, i in chosen.items()}
        own = scores[candidate_id]
        better = sum(s > own for s in scores.values())
        tied = sum(s == own for s in scores.values()) - 1
        hits.append(min(max((k - better) / (tied + 1), 0.0), 1.0))
        losses.append(math.log(sum(math.exp(s) for s in scores.values())) - own)
    return sum(hits) / len(hits), sum(losses) / len(losses), len(hits)


@pytest.mark.parametrize(("k", "limit"), [(1, 50), (3, 50), (2, 4)])
def test_recall_at_k_ranks_each_query_against_the_fixed_candidates(k, limit):
    ids = RNG.integers(0, 8, 40)
    pairs = RNG.normal(size=(40, 2, 5))
    ranked = retrieval(ids, pairs, k, limit)
    recall, loss, queries = _ranked_by_hand(ids, pairs, k, limit)
    assert ranked.queries == queries
    assert ranked.candidates == min(limit, len(set(ids.tolist())))
    assert ranked.recall == pytest.approx(recall)
    assert ranked.loss == pytest.approx(loss)


def test_an_untrained_model_whose_scores_all_tie_earns_chance_recall_only():
    ids = np.arange(20) % 10
    ranked = retrieval(ids, np.zeros((20, 2, 4)), 2, 1000)
    assert ranked.recall == pytest.approx(2 / 10)
    assert ranked.loss == pytest.approx(math.log(10))
    np.testing.assert_array_equal(fixed_candidates(ids, 3), [0, 1, 2])


def test_a_diverged_models_scores_rank_nothing():
    pairs = np.full((20, 2, 4), np.nan)
    assert retrieval(np.arange(20) % 10, pairs, 2, 1000).recall == 0.0


def test_in_batch_softmax_is_judged_by_recall_and_nothing_else():
    assert resolved_metric("auto", "in_batch_softmax", "class_ids") == "recall_at_10"
    assert resolved_metric("recall_at_50", "in_batch_softmax", "class_ids") == "recall_at_50"
    assert METRICS["recall_at_50"].label == "recall@50" and METRICS["recall_at_50"].share
    with pytest.raises(ValueError, match="--metric accuracy does not fit --loss in_batch_softmax"):
        resolved_metric("accuracy", "in_batch_softmax", "class_ids")
    with pytest.raises(ValueError, match="--metric recall_at_10 does not fit --loss mse"):
        resolved_metric("recall_at_10", "mse", "rows")


def _dense(width: int, pairs: bool) -> keras.Model:
    inputs = keras.Input((6,))
    x = keras.layers.Dense(width)(inputs)
    return keras.Model(inputs, keras.ops.stack([x, x], axis=1) if pairs else x)


def test_a_model_that_returns_no_pairs_is_refused_in_one_line():
    with pytest.raises(TowerbenchError) as refused:
        check_model(_dense(5, pairs=False), "m.py:build", "build", (6,), 5, "in_batch_softmax")
    assert str(refused.value) == (
        "m.py:build: the output's shape is (batch, 5), not (batch, 2, d): in_batch_softmax "
        "takes each query's embedding and its candidate's, keras.ops.stack([query, candidate], "
        "axis=1)"
    )
    check_model(_dense(4, pairs=True), "m.py:build", "build", (6,), 9, "in_batch_softmax")


def test_a_built_in_network_under_in_batch_softmax_is_refused_in_one_line(tmp_path):
    data_dir = fixtures_model.write_digits(tmp_path, train=32, test=8)
    manifest = load_manifest(dataset_dir(data_dir, "digits"))
    with pytest.raises(TowerbenchError, match=r"^--loss in_batch_softmax needs your own model"):
        check_config_against_data(TrainConfig(loss="in_batch_softmax", towers=1), manifest)


def test_the_evaluator_ranks_the_whole_test_split_whatever_its_batches(tmp_path):
    """The test loss and recall@K come from the split's outputs on one device, not from the
    evaluation's batches of 500: the same as ranking the model's outputs directly."""
    x = RNG.normal(size=(1200, 6)).astype(np.float32)
    ids = RNG.integers(0, 600, 1200)
    write_dataset(tmp_path / "pairs", "pairs", [str(i) for i in range(600)], {
        "train": (x[:8], ids[:8]), "test": (x, ids)}, 1, {})  # fmt: skip
    manifest = load_manifest(tmp_path / "pairs")
    model = _dense(4, pairs=True)
    files = split_files(tmp_path / "pairs", manifest, "test")
    evaluator = Evaluator(
        model, "/CPU:0", files, manifest.features, None, 600, "in_batch_softmax",
        "recall_at_5", temperature=0.5, eval_candidates=300,
    )  # fmt: skip
    evaluation = evaluator.evaluate([v.value for v in model.trainable_variables])
    direct = retrieval(ids, model.predict(x, verbose=0), 5, 300, temperature=0.5)
    assert evaluation.examples == 1200
    assert evaluation.metric == pytest.approx(direct.recall)
    assert evaluation.loss == pytest.approx(direct.loss, rel=1e-5)


PAIR_MODEL = """
import keras

def build(input_shape, ids):
    inputs = keras.Input(shape=input_shape)
    x = keras.layers.Flatten()(inputs)
    query = keras.layers.Dense(6, activation="tanh")(x)
    candidate = keras.layers.Dense(6)(x)
    return keras.Model(inputs, keras.ops.stack([query, candidate], axis=1))
"""
# Not a mean over examples, and not a loss towerbench knows: each example against its batch's mean.
CENTRED = """
import tensorflow as tf

def centred(y_true, y_pred):
    return tf.reduce_mean(tf.square(y_pred - tf.reduce_mean(y_pred, 0) - y_true), -1)
"""


@pytest.mark.slow
def test_gradcheck_names_in_batch_negatives_as_the_cause_and_does_not_pass(tmp_path):
    from towerbench.model.gradcheck import run_gradcheck

    (tmp_path / "pairs.py").write_text(PAIR_MODEL)
    result = run_gradcheck(
        f"{tmp_path}/pairs.py:build", 2, 16, seed=1, input_shape=(4, 4, 1), num_classes=50,
        loss="in_batch_softmax", temperature=0.5,
    )  # fmt: skip
    assert not result.passed
    assert result.mean_vs_single.max_rel_diff > result.tolerance
    assert result.ghost_vs_mean.max_rel_diff <= result.tolerance  # per shard, as the towers
    assert result.loss_vs_shards > result.tolerance
    document = result.to_json()
    assert document["passed"] is False and document["batch_dependent"] == ["in_batch_softmax"]
    assert (
        "Only the per-shard comparison is at rounding level, so the difference from one device "
        "is in_batch_softmax, not averaging. in_batch_softmax: each tower's softmax sees its own "
        "B/k = 8 candidates, not the batch's B = 16 (the per-example losses differ by "
    ) in document["explanation"]


@pytest.mark.slow
def test_gradcheck_finds_your_own_loss_that_is_not_a_mean_over_examples(tmp_path):
    from towerbench.model.gradcheck import run_gradcheck

    (tmp_path / "losses.py").write_text(CENTRED)
    model = f"{tmp_path}/dense.py:build"
    (tmp_path / "dense.py").write_text(
        "import keras\n\ndef build(input_shape, width):\n    inputs = keras.Input(input_shape)\n"
        "    x = keras.layers.Flatten()(inputs)\n"
        "    return keras.Model(inputs, keras.layers.Dense(width)(x))\n"
    )
    loss = f"{tmp_path}/losses.py:centred"
    result = run_gradcheck(
        model, 2, 16, seed=1, input_shape=(4, 4, 1), num_classes=3, loss=loss, labels="rows"
    )
    assert not result.passed and result.batch_dependent == [loss]
    assert f"{loss}: it is not a mean over examples: each example's loss among a tower's 8 " in (
        result.explanation
    )
    mean = run_gradcheck(
        model, 2, 16, seed=1, input_shape=(4, 4, 1), num_classes=3, loss="mse", labels="rows"
    )
    assert mean.passed and mean.batch_dependent == [] and mean.loss_vs_shards <= 1e-6


@pytest.mark.slow
@pytest.mark.parametrize("towers", [2, 4])
def test_gathered_towers_compute_one_devices_gradient(tmp_path, towers):
    from towerbench.model.gradcheck import run_gradcheck

    (tmp_path / "pairs.py").write_text(PAIR_MODEL)
    result = run_gradcheck(
        f"{tmp_path}/pairs.py:build", towers, 16, seed=1, input_shape=(4, 4, 1), num_classes=5,
        loss="in_batch_softmax", cross_tower="gather", optimizers=("adam", "lamb"),
    )  # fmt: skip
    assert result.passed and result.cross_tower == "gather"
    # The candidate bias's gradient is exactly 0 (it moves a query's logits alike): its rounding
    # noise, turned into LR x g / epsilon steps by adam and lamb, is left out and named.
    for check in result.updates_vs_single:
        assert check.max_rel_diff <= 1e-5, check
        assert len(check.left_out) == 1 and check.left_out[0].endswith("/bias")
    assert "Left out of that comparison: " in result.explanation
    assert result.mean_vs_single.max_rel_diff <= 1e-5
    assert result.loss_vs_shards > 1e-5  # the loss still depends on the batch: gather cures it
    assert "cross_tower gather gives each tower's loss all 16 candidates" in result.explanation


@pytest.mark.slow
def test_gathered_across_two_workers_of_two_towers_compute_one_devices_gradient(tmp_path, capfd):
    from towerbench.cli.main import main

    (tmp_path / "pairs.py").write_text(PAIR_MODEL)
    status = main(
        ["gradcheck", "--model", f"{tmp_path}/pairs.py:build", "--loss", "in_batch_softmax"]
        + ["--cross-tower", "gather", "--workers", "2", "--towers", "2", "--global-batch", "16"]
        + ["--temperature", "0.5", "--json"]
    )
    captured = capfd.readouterr()
    assert status == 0, captured.err[-3000:]
    document = json.loads(captured.out)
    assert document["workers"] == 2 and document["cross_tower"] == "gather"
    assert document["workers_vs_single"]["max_rel_diff"] <= 1e-5
    assert document["mean_vs_single"]["max_rel_diff"] <= 1e-5


def _interactions(data_dir, examples: int = 256, test: int = 64) -> None:
    """Query and candidate features side by side, the candidate's id as the label."""
    rng = np.random.default_rng(0)
    items = rng.normal(size=(40, 3))
    ids = rng.integers(0, 40, examples + test)
    x = np.concatenate([items[ids] + 0.3 * rng.normal(size=(len(ids), 3)), items[ids]], 1)
    x = x.astype(np.float32)
    splits = {"train": (x[:examples], ids[:examples]), "test": (x[examples:], ids[examples:])}
    names = [str(i) for i in range(40)]
    write_dataset(dataset_dir(data_dir, "pairs"), "pairs", names, splits, 1, {})


SIDES = """
import keras

def build(input_shape, ids):
    inputs = keras.Input(shape=input_shape)
    query = keras.layers.Dense(8)(inputs[:, :3])
    candidate = keras.layers.Dense(8)(inputs[:, 3:])
    return keras.Model(inputs, keras.ops.stack([query, candidate], axis=1))
"""


@pytest.mark.slow
def test_gathered_towers_train_as_one_device_and_local_ones_do_not(tmp_path):
    from towerbench.model import training

    _interactions(tmp_path)
    (tmp_path / "sides.py").write_text(SIDES)
    common = {
        "dataset": "pairs", "model": f"{tmp_path}/sides.py:build", "loss": "in_batch_softmax",
        "global_batch": 32, "epochs": 2, "optimizer": "adam", "crop_size": None,
    }  # fmt: skip
    one = training.train(TrainConfig(towers=1, **common), tmp_path)
    gathered = training.train(TrainConfig(towers=2, cross_tower="gather", **common), tmp_path)
    local = training.train(TrainConfig(towers=2, **common), tmp_path)
    for by_one, by_gather, by_local in zip(
        one.history, gathered.history, local.history, strict=True
    ):
        assert by_gather.cross_entropy == pytest.approx(by_one.cross_entropy, rel=1e-4)
        assert by_gather.test_cross_entropy == pytest.approx(by_one.test_cross_entropy, rel=1e-4)
        assert by_local.cross_entropy < by_one.cross_entropy  # 16 candidates each, not 32
    # A gathered tower's gradient is its share of the batch's, not a small batch's: no noise scale.
    assert gathered.history[-1].noise_scale is None and local.history[-1].noise_scale is not None


def test_gather_for_a_mean_over_examples_is_refused_in_one_line(tmp_path):
    data_dir = fixtures_model.write_digits(tmp_path, train=32, test=8)
    manifest = load_manifest(dataset_dir(data_dir, "digits"))
    with pytest.raises(TowerbenchError, match=r"^--cross-tower gather applies to in_batch_softmax"):
        check_config_against_data(TrainConfig(cross_tower="gather", towers=1), manifest)
    own = {"model": "m.py:build", "loss": "in_batch_softmax", "cross_tower": "gather"}
    adascale = TrainConfig(lr_scaling="adascale", **own)
    with pytest.raises(TowerbenchError, match=r"^--cross-tower gather with --lr-scaling adascale"):
        check_config_against_data(adascale, manifest)
    few = TrainConfig(model="m.py:build", loss="in_batch_softmax", eval_candidates=10)
    with pytest.raises(TowerbenchError, match=r"^--metric recall_at_10 ranks each query among"):
        check_config_against_data(few, manifest)
    with pytest.raises(TowerbenchError, match=r"^--cross-tower gather with --xla"):
        check_config_against_data(TrainConfig(xla=True, **own), manifest)


FROM_PYTHON = """
import json
import towerbench
from retrieval import build, interactions

result = towerbench.train(
    model=build, data=interactions(), name="retrieval",
    loss="in_batch_softmax", cross_tower="gather", towers=2, epochs=1, global_batch=64,
    optimizer="adam", tracking_uri="sqlite:///mlflow.db",
)
print(json.dumps(result.model_dump(mode="json")))
"""


@pytest.mark.slow
def test_cross_tower_from_python_trains_gathered_and_gradcheck_passes(tmp_path):
    import mlflow

    shutil.copy(EXAMPLES / "retrieval.py", tmp_path / "retrieval.py")
    done = fixtures_user.run_script(tmp_path, FROM_PYTHON, timeout=600)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["status"] == "completed" and result["metric"] == "recall_at_10"
    assert 0 < result["test_metric"] <= 1
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert client.get_run(result["run_id"]).data.params["cross_tower"] == "gather"
    kept = client.download_artifacts(result["run_id"], "gradcheck.json", str(tmp_path))
    check = json.loads(Path(kept).read_text())
    assert check["passed"] and check["cross_tower"] == "gather"
    assert check["batch_dependent"] == ["in_batch_softmax"]
