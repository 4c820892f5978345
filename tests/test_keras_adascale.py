"""towerbench.keras.AdaScale: AdaScale as a Keras optimizer wrapper in `fit` under
MirroredStrategy, against towerbench's trainer on the same batches; its serialization."""

from __future__ import annotations

import json

import fixtures_model
import keras
import numpy as np
import pytest
import tensorflow as tf
from keras_multi_worker import network

from towerbench.model.adascale import AdaScale as AdaScaleState
from towerbench.model.adascale import AdaScaleSchedule
from towerbench.model.devices import configure_tower_devices
from towerbench.model.keras_adascale import AdaScale, AdaScaleProgress
from towerbench.model.keras_gradients import measures_inside
from towerbench.model.keras_noise_scale import NoiseScale
from towerbench.model.networks import Network
from towerbench.model.schedules import EpochSchedule, StepSchedule
from towerbench.model.towers import TowerTrainer

pytestmark = pytest.mark.usefixtures("fit_garbage_collected")

TOWERS, PER_TOWER, REFERENCE_BATCH, STEPS, LR = 4, 16, 16, 6, 0.1


def _network(seed: int = 3) -> keras.Model:
    keras.utils.set_random_seed(seed)
    return network()


def _batches() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    examples = STEPS * TOWERS * PER_TOWER
    images = rng.normal(size=(examples, 8, 8, 1)).astype("float32")
    labels = (np.abs(images[:, :4].sum(axis=(1, 2, 3))) * 3).astype("int32") % 10
    return images, labels


def _trainers_run(weights: list[np.ndarray], images, labels, optimizer):
    """The trainer on 4 logical CPUs over the same batches: its gain each step, tau, its
    weights and its noise scale."""
    devices = configure_tower_devices(TOWERS)
    global_batch = TOWERS * PER_TOWER
    with tf.device(devices.parameter_device):
        model = _network()
        model.set_weights(weights)
        state = AdaScaleState(REFERENCE_BATCH, global_batch, TOWERS)
    schedule = EpochSchedule(LR, LR, 0.0, "constant", 100.0)
    power = 0.5 if isinstance(optimizer, keras.optimizers.Adam) else 1.0
    optimizer.learning_rate = AdaScaleSchedule(StepSchedule(schedule, 1.0), power, state)
    trainer = TowerTrainer(Network(model, []), optimizer, devices, adascale=state)
    gains = []
    for step in range(STEPS):
        batch = slice(step * global_batch, (step + 1) * global_batch)
        trainer.step(tf.constant(images[batch]), tf.constant(labels[batch]))
        gains.append(float(state.gain.numpy()))
    return gains, float(state.tau.numpy()), model.get_weights(), trainer.noise_scale()


class _GainsEachStep(keras.callbacks.Callback):
    def __init__(self, adascale: AdaScale):
        super().__init__()
        self.adascale = adascale
        self.gains: list[float] = []

    def on_train_batch_end(self, batch, logs=None):
        self.gains.append(float(self.adascale.gain.numpy()))


@pytest.mark.slow
@pytest.mark.parametrize(
    "make_optimizer",
    [lambda: keras.optimizers.SGD(LR, momentum=0.9), lambda: keras.optimizers.Adam(LR)],
    ids=["momentum", "adam"],
)
def test_adascale_in_fit_under_mirrored_strategy_is_the_trainers(make_optimizer) -> None:
    """The same network, weights and batches: `fit` with the wrapper on 4 replicas against the
    trainer on 4 towers gives each step's gain, tau and the weights to 1e-5 (AdamScale too), and
    NoiseScale beside it the trainer's noise scale."""
    images, labels = _batches()
    weights = _network().get_weights()
    gains, tau, trained, noise_scale = _trainers_run(weights, images, labels, make_optimizer())
    assert 1.0 < max(gains) <= TOWERS  # a gain was measured, not assumed
    strategy = fixtures_model.mirrored_strategy()
    with strategy.scope():
        model = _network()
        model.set_weights(weights)
        optimizer = AdaScale(make_optimizer(), REFERENCE_BATCH, TOWERS * PER_TOWER)
        model.compile(
            optimizer=optimizer,
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    each_step, progress = _GainsEachStep(optimizer), AdaScaleProgress()
    callbacks = [each_step, progress, NoiseScale(TOWERS * PER_TOWER)]
    data = tf.data.Dataset.from_tensor_slices((images, labels)).batch(TOWERS * PER_TOWER)
    history = model.fit(data, epochs=1, shuffle=False, verbose=0, callbacks=callbacks)
    np.testing.assert_allclose(each_step.gains, gains, rtol=1e-5)
    assert float(optimizer.progress.numpy()) == pytest.approx(tau, rel=1e-5)
    assert history.history["adascale_progress"] == [pytest.approx(tau, rel=1e-5)]
    assert history.history["adascale_gain"] == [pytest.approx(gains[-1], rel=1e-5)]
    assert history.history["noise_scale"] == [pytest.approx(noise_scale, rel=1e-4)]
    for ours, theirs in zip(model.get_weights(), trained, strict=True):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)


def test_adascale_survives_serialization_with_its_reference_schedule() -> None:
    schedule = keras.optimizers.schedules.CosineDecay(0.1, 100, warmup_target=0.4, warmup_steps=10)
    wrapped = AdaScale(keras.optimizers.Adam(schedule), reference_batch=32, global_batch=256)
    document = json.dumps(keras.optimizers.serialize(wrapped))
    restored = keras.optimizers.deserialize(json.loads(document))
    assert isinstance(restored, AdaScale) and restored.power == wrapped.power == 0.5
    assert (restored.reference_batch, restored.global_batch) == (32, 256)
    inner = restored.inner_optimizer._learning_rate
    assert isinstance(inner, AdaScaleSchedule)
    for step in (0, 5, 10, 60, 120):  # unbuilt: the reference schedule at the step
        assert float(inner(step)) == pytest.approx(float(schedule(step)), rel=1e-6)
    assert AdaScale(keras.optimizers.SGD(0.1), 32, 256).power == 1.0
    with pytest.raises(TypeError, match="inner optimizer's schedule"):
        wrapped.learning_rate = 0.5


@pytest.mark.slow
def test_noise_scale_in_fit_is_the_trainers_estimate(tmp_path) -> None:
    """NoiseScale during `fit` on 4 replicas against the trainer's noise scale on 4 towers, the
    same weights and batches: the same B_simple to 1e-4, in History and in the active MLflow
    run; the model gets its optimizer back."""
    import mlflow

    images, labels = _batches()
    weights = _network().get_weights()
    devices = configure_tower_devices(TOWERS)
    with tf.device(devices.parameter_device):
        reference = _network()
        reference.set_weights(weights)
    trainer = TowerTrainer(Network(reference, []), keras.optimizers.SGD(LR), devices)
    global_batch = TOWERS * PER_TOWER
    for step in range(STEPS):
        batch = slice(step * global_batch, (step + 1) * global_batch)
        trainer.step(tf.constant(images[batch]), tf.constant(labels[batch]))
    expected = trainer.noise_scale()
    assert np.isfinite(expected)
    with fixtures_model.mirrored_strategy().scope():
        model = _network()
        model.set_weights(weights)
        own = keras.optimizers.SGD(LR)
        model.compile(
            optimizer=own, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        )
    data = tf.data.Dataset.from_tensor_slices((images, labels)).batch(global_batch)
    noise = NoiseScale(global_batch)
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    try:
        with mlflow.start_run() as run:
            history = model.fit(data, epochs=1, shuffle=False, verbose=0, callbacks=[noise])
        logged = mlflow.tracking.MlflowClient().get_metric_history(run.info.run_id, "noise_scale")
    finally:
        mlflow.set_tracking_uri(previous)
    assert history.history["noise_scale"] == [pytest.approx(expected, rel=1e-4)]
    assert [(m.step, m.value) for m in logged] == [(1, pytest.approx(expected, rel=1e-4))]
    assert model.optimizer is own and int(own.iterations.numpy()) == STEPS
    for ours, theirs in zip(model.get_weights(), reference.get_weights(), strict=True):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_adascale_under_multi_worker_mirrored_strategy_is_the_trainers(tmp_path) -> None:
    """Two worker processes on 127.0.0.1 (MultiWorkerMirroredStrategy, one replica each) train
    with AdaScale in a custom loop (Keras 3's fit fails under this strategy: keras_multi_worker.py):
    each step's gain, tau and the weights equal the trainer's on 2 towers over the same batches,
    on both workers."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from fixtures_servers import free_port

    towers, global_batch = 2, 2 * PER_TOWER
    images, labels = _batches()
    keras.utils.set_random_seed(5)
    weights = network().get_weights()
    np.savez(tmp_path / "weights.npz", **{str(i): w for i, w in enumerate(weights)})
    np.savez(tmp_path / "batches.npz", images=images, labels=labels)
    devices = configure_tower_devices(towers)
    with tf.device(devices.parameter_device):
        reference = network()
        reference.set_weights(weights)
        state = AdaScaleState(REFERENCE_BATCH, global_batch, towers)
    optimizer = keras.optimizers.SGD(LR, momentum=0.9)
    optimizer.learning_rate = AdaScaleSchedule(
        StepSchedule(EpochSchedule(LR, LR, 0.0, "constant", 100.0), 1.0), state=state
    )
    trainer = TowerTrainer(Network(reference, []), optimizer, devices, adascale=state)
    gains = []
    for step in range(len(labels) // global_batch):
        batch = slice(step * global_batch, (step + 1) * global_batch)
        trainer.step(tf.constant(images[batch]), tf.constant(labels[batch]))
        gains.append(float(state.gain.numpy()))
    cluster = {"worker": [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]}
    script = Path(__file__).with_name("keras_multi_worker.py")
    arguments = [tmp_path / "weights.npz", tmp_path / "batches.npz", global_batch, REFERENCE_BATCH]
    workers = [
        subprocess.Popen(
            [sys.executable, str(script), *map(str, arguments), str(LR)],
            env={
                **os.environ,
                "TF_CONFIG": json.dumps(
                    {"cluster": cluster, "task": {"type": "worker", "index": i}}
                ),
                "PYTHONPATH": str(script.parent),
            },
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(towers)
    ]
    try:
        finished = [worker.communicate(timeout=300) for worker in workers]
    finally:
        for worker in workers:
            worker.kill()
    for worker, (stdout, stderr) in zip(workers, finished, strict=True):
        assert worker.returncode == 0, stderr[-3000:]
        said = json.loads(stdout.strip().splitlines()[-1])
        assert said["replicas"] == towers and max(said["gains"]) > 1.0
        np.testing.assert_allclose(said["gains"], gains, rtol=1e-5)
        assert said["tau"] == pytest.approx(float(state.tau.numpy()), rel=1e-5)
        for ours, theirs in zip(said["weights"], reference.get_weights(), strict=True):
            np.testing.assert_allclose(np.array(ours), theirs, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_adascale_goes_on_across_fits_with_noise_scale_and_saves_with_the_model(tmp_path) -> None:
    """A second fit (NoiseScale beside both) continues AdaScale's progress instead of rebuilding
    it, and the model saved as .keras loads with AdaScale, its progress and its step count."""
    images, labels = _batches()
    with fixtures_model.mirrored_strategy().scope():
        model = _network()
        optimizer = AdaScale(keras.optimizers.SGD(LR, momentum=0.9), REFERENCE_BATCH, 64)
        model.compile(
            optimizer=optimizer,
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    data = tf.data.Dataset.from_tensor_slices((images, labels)).batch(TOWERS * PER_TOWER)
    progress = []
    for _ in range(2):
        model.fit(data, epochs=1, shuffle=False, verbose=0, callbacks=[NoiseScale(64)])
        progress.append(float(optimizer.progress.numpy()))
    assert progress[1] > progress[0] >= STEPS  # tau went on: gains are at least 1 a step
    assert model.optimizer is optimizer and int(optimizer.iterations.numpy()) == 2 * STEPS
    model.save(tmp_path / "model.keras")
    loaded = keras.models.load_model(tmp_path / "model.keras")
    assert isinstance(loaded.optimizer, AdaScale)
    assert float(loaded.optimizer.progress.numpy()) == pytest.approx(progress[1])
    assert int(loaded.optimizer.iterations.numpy()) == 2 * STEPS


def test_adascale_refuses_what_it_cannot_wrap_in_one_line() -> None:
    inner = keras.optimizers.SGD(LR)
    wrapped = keras.optimizers.LossScaleOptimizer(AdaScale(keras.optimizers.SGD(LR), 16, 64))
    assert measures_inside(wrapped) and not measures_inside(inner)
    with pytest.raises(ValueError, match="wrap AdaScale in the LossScaleOptimizer"):
        AdaScale(keras.optimizers.LossScaleOptimizer(inner), REFERENCE_BATCH, 64)
    with pytest.raises(ValueError, match="accumulates gradients"):
        AdaScale(keras.optimizers.SGD(LR, gradient_accumulation_steps=2), REFERENCE_BATCH, 64)
    with fixtures_model.mirrored_strategy().scope():
        uneven = AdaScale(keras.optimizers.SGD(LR), REFERENCE_BATCH, 66)
        with pytest.raises(ValueError, match="global_batch 66 does not split evenly over 4"):
            uneven.build(_network().trainable_variables)


@pytest.mark.slow
def test_under_mixed_precision_noise_scale_measures_inside_the_loss_scale_optimizer() -> None:
    """float16 layers, LossScaleOptimizer(AdaScale(SGD)) and NoiseScale: the noise scale is
    measured on unscaled gradients, inside the loss scaling, so AdaScale still measures its own
    gains (between 1 and S, not S at every step) and the noise scale is finite."""
    images, labels = _batches()
    with fixtures_model.mirrored_strategy().scope():
        model = keras.Sequential(
            [
                keras.Input((8, 8, 1)),
                keras.layers.Flatten(),
                keras.layers.Dense(16, activation="relu", dtype="mixed_float16"),
                keras.layers.Dense(10, dtype="float32"),
            ]
        )
        adascale = AdaScale(keras.optimizers.SGD(LR, momentum=0.9), REFERENCE_BATCH, 64)
        model.compile(
            optimizer=keras.optimizers.LossScaleOptimizer(adascale),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    data = tf.data.Dataset.from_tensor_slices((images, labels)).batch(TOWERS * PER_TOWER)
    each_step = _GainsEachStep(adascale)
    history = model.fit(
        data, epochs=1, shuffle=False, verbose=0, callbacks=[each_step, NoiseScale(64)]
    )
    scale = TOWERS * PER_TOWER / REFERENCE_BATCH
    assert all(1.0 <= gain < scale for gain in each_step.gains[1:]), each_step.gains
    assert np.isfinite(history.history["noise_scale"][-1])
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    assert model.optimizer.inner_optimizer is adascale
