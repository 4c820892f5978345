"""The learning-rate policy: scaling rules, warmup and decay counted in epochs."""

import math
from typing import get_args

import fixtures_model  # noqa: F401
import numpy as np
import pytest

from towerbench.config.sections import TrainConfig
from towerbench.model.input_pipeline import EpochPlan
from towerbench.model.schedules import (
    Decay,
    StepSchedule,
    scaled_learning_rate,
    schedule_from_config,
)


def test_the_schedule_knows_every_decay_the_config_accepts():
    assert get_args(Decay) == get_args(TrainConfig.model_fields["decay"].annotation)


def test_scaling_rules():
    assert scaled_learning_rate(0.1, 512, 128, "none") == pytest.approx(0.1)
    assert scaled_learning_rate(0.1, 512, 128, "linear") == pytest.approx(0.4)
    assert scaled_learning_rate(0.1, 512, 128, "sqrt") == pytest.approx(0.2)


def _lr_per_epoch(config: TrainConfig, examples: int) -> tuple[np.ndarray, float]:
    """LR the optimizer sees at fixed epoch points, and the peak LR."""
    plan = EpochPlan(examples, config.global_batch, config.towers)
    schedule = schedule_from_config(config)
    by_step = StepSchedule(schedule, plan.steps)
    epochs = np.arange(0, 8, 0.5)
    return np.array([float(by_step(e * plan.steps)) for e in epochs]), schedule.peak_lr


@pytest.mark.parametrize("decay", ["staircase", "piecewise", "cosine", "linear", "constant"])
def test_schedule_in_epochs_is_the_same_for_1_2_and_4_towers(decay):
    common = dict(
        dataset="cifar10",
        epochs=8,
        warmup_epochs=2,
        decay=decay,
        decay_epochs=3,
        decay_boundaries=[4, 6],
        lr_scaling="linear",
    )
    # Same global batch: the towers only split it, nothing about the schedule may change.
    same_batch = [
        _lr_per_epoch(TrainConfig(towers=k, global_batch=128, **common), 50_000)[0]
        for k in (1, 2, 4)
    ]
    assert all(np.array_equal(same_batch[0], other) for other in same_batch[1:])
    # Fixed per-tower batch (adding devices): steps per epoch change, the shape in epochs doesn't.
    shapes = []
    for k in (1, 2, 4):
        lrs, peak = _lr_per_epoch(TrainConfig(towers=k, global_batch=128 * k, **common), 50_000)
        shapes.append((lrs, peak))
    after_warmup = np.arange(0, 8, 0.5) >= 2
    for lrs, peak in shapes[1:]:
        np.testing.assert_allclose(
            lrs[after_warmup] / peak, shapes[0][0][after_warmup] / shapes[0][1], rtol=1e-6
        )


def test_warmup_and_decay_values():
    config = TrainConfig(
        dataset="cifar10",
        towers=4,
        global_batch=512,
        lr_scaling="linear",
        warmup_epochs=2,
        decay="piecewise",
        decay_boundaries=[4, 6],
        epochs=8,
    )
    schedule = schedule_from_config(config)
    assert float(schedule(0.0)) == pytest.approx(0.1)  # warmup starts at base_lr
    assert float(schedule(1.0)) == pytest.approx(0.25)
    assert float(schedule(2.0)) == pytest.approx(0.4)
    assert float(schedule(4.0)) == pytest.approx(0.04)
    assert float(schedule(6.5)) == pytest.approx(0.004)
    tutorial = schedule_from_config(TrainConfig(dataset="cifar10"))
    assert float(tutorial(349.9)) == pytest.approx(0.1)
    assert float(tutorial(350.0)) == pytest.approx(0.01)  # x0.1 every 350 epochs
    cosine = schedule_from_config(TrainConfig(dataset="cifar10", decay="cosine", epochs=10))
    assert float(cosine(5.0)) == pytest.approx(0.05)
    assert math.isclose(float(cosine(10.0)), 0.0, abs_tol=1e-8)
    # Linear: warmup to the peak, then a straight line to 0 at the run's last epoch (one-cycle).
    one_cycle = schedule_from_config(config.model_copy(update={"decay": "linear", "epochs": 10}))
    assert float(one_cycle(2.0)) == pytest.approx(0.4)
    assert float(one_cycle(6.0)) == pytest.approx(0.2)
    assert math.isclose(float(one_cycle(10.0)), 0.0, abs_tol=1e-8)


def test_updates_budget_gives_every_run_the_reference_number_of_steps():
    """`budget: updates`: 4 towers train 4x the epochs, and the LR is the same function of the
    optimizer step as the 1-tower run's (after the peak is scaled)."""
    from towerbench.config.grid import expand
    from towerbench.config.params import SweepGrid

    base = TrainConfig(
        dataset="cifar10",
        epochs=5,
        reference_batch=128,
        warmup_epochs=1,
        decay="piecewise",
        decay_boundaries=[3],
    )
    runs = expand(
        base,
        SweepGrid(
            towers=[1, 4],
            lr_scaling=["linear"],
            warmup_epochs=[1],
            seeds=[0],
            per_tower_batch=128,
            budget="updates",
        ),
    )
    one, four = runs
    assert (one.epochs, four.epochs) == (5, 20)
    assert four.warmup_epochs == 4 and four.decay_boundaries == [12]
    examples = 50_000
    steps = [
        round(run.epochs * EpochPlan(examples, run.global_batch, run.towers).steps) for run in runs
    ]
    assert abs(steps[0] - steps[1]) / steps[0] < 0.01  # equal updates, up to partial batches
    one_lr = StepSchedule(schedule_from_config(one), EpochPlan(examples, 128, 1).steps)
    four_lr = StepSchedule(schedule_from_config(four), EpochPlan(examples, 512, 4).steps)
    for step in (500, 1000, 1900):  # after the 4-tower warmup
        assert float(four_lr(step)) / 4 == pytest.approx(float(one_lr(step)), rel=0.01, abs=1e-7)


KERAS_SCHEDULE_CASES = [
    # (decay, warmup epochs, Keras' own schedule class expected, or None: a float LR)
    ("cosine", 2, "CosineDecay"),
    ("cosine", 0, "CosineDecay"),
    ("piecewise", 0, "PiecewiseConstantDecay"),
    ("staircase", 0, "ExponentialDecay"),
    ("linear", 0, "PolynomialDecay"),
    ("constant", 0, None),
    ("linear", 2, "StepSchedule"),
    ("piecewise", 1.5, "StepSchedule"),
    ("staircase", 2, "StepSchedule"),
    ("constant", 2, "StepSchedule"),
]


def _lr_at(learning_rate, step: int) -> float:
    return float(learning_rate(step)) if callable(learning_rate) else float(learning_rate)


@pytest.mark.parametrize(("decay", "warmup", "kind"), KERAS_SCHEDULE_CASES)
def test_the_keras_schedule_gives_the_trainers_lr_at_every_step_and_survives_serialization(
    decay, warmup, kind
):
    """What a user's `model.fit` gets (towerbench.keras) against what the trainer follows: the
    same LR at every step, before and after `keras.optimizers.serialize`/`deserialize` through
    JSON; a boundary at a fractional step (2.5 epochs x 7 steps) drops where the trainer's does."""
    import json

    import keras

    from towerbench.model.schedules import keras_schedule

    config = TrainConfig(
        dataset="cifar10",
        towers=4,
        global_batch=512,
        epochs=8,
        lr_scaling="linear",
        warmup_epochs=warmup,
        decay=decay,
        decay_epochs=3,
        decay_boundaries=[5, 2.5],
    )
    steps_per_epoch = 7
    trainers = StepSchedule(schedule_from_config(config), steps_per_epoch)
    exported = keras_schedule(schedule_from_config(config), steps_per_epoch)
    assert (type(exported).__name__ if kind else None) == (kind or None)
    assert kind is not None or isinstance(exported, float)
    document = json.dumps(keras.optimizers.serialize(keras.optimizers.SGD(exported)))
    restored = keras.optimizers.deserialize(json.loads(document))._learning_rate
    steps = range(8 * steps_per_epoch + 3)
    expected = [_lr_at(trainers, step) for step in steps]
    # float32 rounding of the peak: near a cosine's end 1 + cos(pi x) loses digits in both.
    rounding = 1e-7 * trainers.schedule.peak_lr
    for learning_rate in (exported, restored):
        np.testing.assert_allclose(
            [_lr_at(learning_rate, step) for step in steps], expected, rtol=2e-6, atol=rounding
        )


def test_a_piecewise_drop_lands_on_the_trainers_step_where_b_times_e_rounds() -> None:
    """1.1 epochs x 100 steps is 110.00000000000001 in float64; the trainer, in float32, drops
    at step 110: so does the exported schedule."""
    import keras

    from towerbench.model.schedules import EpochSchedule, keras_schedule

    schedule = EpochSchedule(0.1, 0.1, 0.0, "piecewise", 3.0, decay_boundaries=(1.1,))
    exported = keras_schedule(schedule, 100)
    assert isinstance(exported, keras.optimizers.schedules.PiecewiseConstantDecay)
    trainers = StepSchedule(schedule, 100)
    for step in (108, 109, 110, 111):
        assert float(exported(step)) == pytest.approx(float(trainers(step)), rel=1e-6)
