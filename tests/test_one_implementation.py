"""One implementation each of AdaScale, the LR schedule family and the noise-scale estimator:
the trainer's step and towerbench.keras use the same objects, and the tree holds no second copy."""

from __future__ import annotations

import ast

import keras
import tensorflow as tf
from test_architecture import FLOORS, ROOT

from towerbench.config.sections import TrainConfig
from towerbench.keras import AdaScale as KerasAdaScale
from towerbench.model.adascale import AdaScale, AdaScaleSchedule
from towerbench.model.devices import configure_tower_devices
from towerbench.model.keras_noise_scale import NoiseMeasuring
from towerbench.model.networks import Network
from towerbench.model.noise_scale import NoiseScaleEstimator
from towerbench.model.schedules import StepSchedule, schedule_from_config
from towerbench.model.towers import tower_trainer


def _classes() -> dict[str, tuple[str, list[str]]]:
    """Every class of the package: 'file:name' -> its bases as written."""
    found = {}
    for path in [p for floor in FLOORS for p in sorted((ROOT / floor).rglob("*.py"))]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases = [ast.unparse(base) for base in node.bases]
                found[f"{path.relative_to(ROOT)}:{node.name}"] = (node.name, bases)
    return found


def test_the_tree_holds_one_lr_schedule_family_one_adascale_and_one_estimator() -> None:
    classes = _classes()
    schedules = {k for k, (_, bases) in classes.items() if any("Schedule" in b for b in bases)}
    assert schedules == {"model/schedules.py:StepSchedule", "model/adascale.py:AdaScaleSchedule"}
    modules = {k for k, (_, bases) in classes.items() if "tf.Module" in bases}
    estimators = {k for k in modules if "AdaScale" in k or "Noise" in k}
    assert estimators == {"model/adascale.py:AdaScale", "model/noise_scale.py:NoiseScaleEstimator"}
    # The Keras faces wrap those, they do not estimate: no module besides the two estimators
    # and the wrappers' shared base computes the one-step estimates.
    callers = {
        path.relative_to(ROOT).as_posix()
        for floor in FLOORS
        for path in (ROOT / floor).rglob("*.py")
        if "noise_estimates(" in path.read_text()
    }
    assert callers == {"model/adascale.py", "model/noise_scale.py"}


def _network() -> keras.Model:
    inputs = keras.Input((4,))
    return keras.Model(inputs, keras.layers.Dense(3)(inputs))


def test_the_trainer_and_the_keras_faces_are_built_of_the_same_objects() -> None:
    devices = configure_tower_devices(2)
    config = TrainConfig(towers=2, global_batch=8, lr_scaling="adascale", reference_batch=4)
    with tf.device(devices.parameter_device):
        state = AdaScale(config.reference_batch, config.global_batch, config.replicas)
        network = Network(_network(), [])
    schedule = AdaScaleSchedule(StepSchedule(schedule_from_config(config), 10.0), state=state)
    trainer = tower_trainer(network, config, devices, schedule, adascale=state)
    assert type(trainer.noise) is NoiseScaleEstimator
    assert trainer.optimizer._learning_rate is schedule and schedule.state is trainer.adascale

    variables = _network().trainable_variables
    wrapped = KerasAdaScale(keras.optimizers.SGD(0.1), reference_batch=4, global_batch=8)
    wrapped.build(variables)
    assert type(wrapped.state) is AdaScale
    assert type(wrapped.inner_optimizer._learning_rate) is AdaScaleSchedule
    assert wrapped.inner_optimizer._learning_rate.state is wrapped.state
    measuring = NoiseMeasuring(keras.optimizers.SGD(0.1), global_batch=8)
    measuring.build(variables)
    assert type(measuring.estimator) is NoiseScaleEstimator
