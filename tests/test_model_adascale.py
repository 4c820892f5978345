"""AdaScale's gain and tau: against a problem whose gradient mean and variance are known in
closed form, against fairscale's formulas, and exactly 1 (tau = steps) with one replica."""

import fixtures_model  # noqa: F401
import keras
import numpy as np
import pytest
import tensorflow as tf

from towerbench.model.adascale import (
    AdaScale,
    AdaScaleSchedule,
    ScaleInvariantBudget,
    default_smoothing,
    gain_ratio,
    reference_schedule,
    reference_steps_per_epoch,
)
from towerbench.model.schedules import EpochSchedule, StepSchedule

# Least squares on Gaussian data: loss 1/2 (w.x - y)^2 with x ~ N(0, I_d), y = w*.x + e,
# e ~ N(0, s^2). One example's gradient at w is g = x (x.delta - e), delta = w - w*, so
#     mu = E g = delta,    tr(Sigma) = E|g|^2 - |mu|^2 = (d + 1)|delta|^2 + d s^2
# (E[|x|^2 (x.delta)^2] = (d + 2)|delta|^2 for Gaussian x).
DIMENSIONS = 10
LABEL_NOISE = 1.0
STEPS = 2000
# Over 8 seeds of these simulations the gain's standard deviation was 0.7-0.8% of its value,
# sigma^2's about 1.3% and |mu|^2's about 2.6% (2000 steps, fairscale's default smoothing).
GAIN_TOLERANCE = 0.03
ESTIMATE_TOLERANCE = 0.08


def _towers_norms(delta: np.ndarray, replicas: int, per_replica: int, seed: int):
    """(small, big) of each step: mean over replicas of |g_t|^2 and |mean_t g_t|^2, where g_t is
    the mean gradient of `per_replica` fresh examples."""
    rng = np.random.default_rng(seed)
    shape = (STEPS, replicas, per_replica)
    x = rng.standard_normal((*shape, DIMENSIONS))
    noise = LABEL_NOISE * rng.standard_normal(shape)
    per_example = x * (x @ delta - noise)[..., None]  # (steps, R, b, d)
    per_replica_mean = per_example.mean(axis=2)  # (steps, R, d)
    small = np.mean(np.sum(per_replica_mean**2, axis=-1), axis=1)
    big = np.sum(per_replica_mean.mean(axis=1) ** 2, axis=-1)
    return small.astype(np.float32), big.astype(np.float32)


def _run(adascale: AdaScale, small: np.ndarray, big: np.ndarray, global_batch: int) -> None:
    update = tf.function(lambda s, b: adascale.update(s, b, global_batch))
    for step_small, step_big in zip(small, big, strict=True):
        update(tf.constant(step_small), tf.constant(step_big))


@pytest.mark.parametrize(
    ("delta_norm", "replicas", "per_replica", "reference_batch"),
    [
        (1.0, 4, 16, 16),  # S = R = 4: B_noise 21 near the reference batch
        (1.0, 4, 32, 16),  # S = 8 != R: sigma^2 is a 16-example gradient's, not a tower's
        (1.0, 2, 16, 16),  # R = 2: one degree of freedom per step
        (0.0, 4, 16, 16),  # at the optimum mu = 0: the gain is S
    ],
)
def test_gain_matches_the_closed_form_of_least_squares(
    delta_norm, replicas, per_replica, reference_batch
):
    delta = np.zeros(DIMENSIONS)
    delta[0] = delta_norm
    small, big = _towers_norms(delta, replicas, per_replica, seed=replicas + per_replica)
    global_batch = replicas * per_replica
    adascale = AdaScale(reference_batch, global_batch, replicas)
    _run(adascale, small, big, global_batch)

    trace = (DIMENSIONS + 1) * delta_norm**2 + DIMENSIONS * LABEL_NOISE**2
    sigma_sq, mu_sq = trace / reference_batch, delta_norm**2
    expected = gain_ratio(sigma_sq, mu_sq, global_batch / reference_batch)
    state = adascale.read()
    assert state.gain == pytest.approx(expected, rel=GAIN_TOLERANCE)
    assert state.sigma_sq == pytest.approx(sigma_sq, rel=ESTIMATE_TOLERANCE)
    assert state.mu_sq == pytest.approx(mu_sq, rel=ESTIMATE_TOLERANCE, abs=0.01)
    assert 1.0 <= state.gain <= global_batch / reference_batch


def test_one_step_equals_fairscales_estimator():
    """fairscale (appendix B.3): sigma^2 = S/(N-1) (mean |g_i|^2 - |g|^2), |mu|^2 = |g|^2 -
    sigma^2/S, then r = (sigma^2 + |mu|^2) / (sigma^2/S + |mu|^2), after one debiased update."""
    replicas, per_replica, reference_batch = 4, 32, 16
    scale = replicas * per_replica / reference_batch
    small, big = 3.0, 1.25
    fairscale_var = scale / (replicas - 1) * (small - big)
    fairscale_sqr = big - fairscale_var / scale
    fairscale_gain = (fairscale_var + fairscale_sqr) / (fairscale_var / scale + fairscale_sqr)

    adascale = AdaScale(reference_batch, replicas * per_replica, replicas)
    adascale.update(tf.constant(small), tf.constant(big), replicas * per_replica)
    state = adascale.read()
    assert state.sigma_sq == pytest.approx(fairscale_var, rel=1e-6)
    assert state.mu_sq == pytest.approx(fairscale_sqr, rel=1e-6)
    assert state.gain == pytest.approx(fairscale_gain, rel=1e-6)


@pytest.mark.parametrize(
    ("replicas", "global_batch"),
    [(1, 128), (1, 512), (4, 128)],  # one tower; one tower at 4x; 4 towers at the reference batch
)
def test_gain_is_exactly_one_and_tau_counts_steps_when_nothing_can_scale(replicas, global_batch):
    adascale = AdaScale(reference_batch=128, global_batch=global_batch, replicas=replicas)
    rng = np.random.default_rng(0)

    @tf.function
    def step(small, big):
        adascale.update(small, big, global_batch)
        adascale.advance()

    for _ in range(300):
        small, big = rng.uniform(1.0, 5.0), rng.uniform(0.0, 1.0)
        step(tf.constant(small, tf.float32), tf.constant(big, tf.float32))
    assert adascale.gain.numpy() == 1.0
    assert adascale.tau.numpy() == 300.0


def test_one_replica_schedule_is_the_plain_schedule_bit_for_bit():
    schedule = EpochSchedule(0.1, 0.1, 0.0, "cosine", total_epochs=7.0)
    adascale = AdaScale(reference_batch=128, global_batch=128, replicas=1)
    at_tau = AdaScaleSchedule(StepSchedule(schedule, 13), state=adascale)
    at_step = StepSchedule(schedule, 13)
    for step in range(100):
        assert at_tau(None).numpy() == at_step(step).numpy()
        adascale.update(tf.constant(0.0), tf.constant(0.0), 128)
        adascale.advance()


def test_a_non_finite_step_leaves_the_averages():
    adascale = AdaScale(reference_batch=16, global_batch=64, replicas=4)
    adascale.update(tf.constant(3.0), tf.constant(1.25), 64)
    before = adascale.read()
    adascale.update(tf.constant(np.inf, tf.float32), tf.constant(1.0), 64)
    assert adascale.read() == before


def test_the_step_uses_the_lr_at_tau_before_the_step_times_the_gain():
    """update -> optimizer step -> advance: the LR of step t is lr(tau_t) * r_t."""
    replicas, per_replica, reference_batch = 4, 16, 16
    trace, mu_sq = 21.0, 1.0  # expected norms, so every one-step estimate is exact
    small = mu_sq + trace / per_replica
    big = mu_sq + trace / (replicas * per_replica)
    gain = gain_ratio(trace / reference_batch, mu_sq, replicas * per_replica / reference_batch)

    adascale = AdaScale(reference_batch, replicas * per_replica, replicas)
    decaying = EpochSchedule(0.1, 0.1, 0.0, "linear", total_epochs=10.0)
    optimizer = keras.optimizers.SGD(AdaScaleSchedule(StepSchedule(decaying, 10), state=adascale))
    weight = tf.Variable([0.0])
    optimizer.build([weight])

    @tf.function
    def step():
        adascale.update(tf.constant(small), tf.constant(big), replicas * per_replica)
        optimizer.apply([tf.constant([1.0])], [weight])
        adascale.advance()

    step()
    step()
    # Step 1 at tau = 0: LR 0.1 r. Step 2 at tau = r (r/10 of 10 epochs): LR 0.1 (1 - r/100) r.
    expected = -(0.1 * gain + 0.1 * (1 - gain / 100) * gain)
    assert weight.numpy()[0] == pytest.approx(expected, rel=1e-6)
    assert adascale.tau.numpy() == pytest.approx(2 * gain, rel=1e-6)


def test_reference_schedule_has_the_base_lr_and_no_warmup():
    scaled = EpochSchedule(0.1, 0.4, 2.0, "linear", total_epochs=12.0)
    reference = reference_schedule(0.1, scaled)
    assert float(reference(0.0)) == pytest.approx(0.1)
    assert float(reference(6.0)) == pytest.approx(0.05)
    assert float(reference(12.0)) == pytest.approx(0.0)


def test_budget_ends_when_tau_reaches_the_reference_steps():
    # digits' 1437 training examples at the reference batch 128: 12 steps per epoch.
    assert reference_steps_per_epoch(1437, 128) == 12
    budget = ScaleInvariantBudget.of(15, 1437, reference_batch=128, global_batch=512)
    assert budget == ScaleInvariantBudget(reference_steps=180, max_gain=4.0)
    assert budget.steps_left(0.0) == 45  # at most 4 per step
    assert budget.steps_left(178.5) == 1
    assert budget.steps_left(180.0) == 0
    assert budget.steps_left(183.2) == 0


def test_default_smoothing_is_fairscales():
    assert default_smoothing(4) == pytest.approx(0.996)
    assert default_smoothing(2000) == 0.0
    with pytest.raises(ValueError, match="smoothing"):
        AdaScale(128, 512, 4, smoothing=1.0)


def test_a_short_last_batch_gets_its_own_gain_and_the_log_reads_the_full_batchs():
    adascale = AdaScale(reference_batch=16, global_batch=64, replicas=4)
    adascale.update(tf.constant(3.0), tf.constant(1.25), 64)
    full = float(adascale.gain.numpy())
    adascale.update(tf.constant(3.0), tf.constant(1.25), 24)  # 6 per tower: S = 1.5
    short = float(adascale.gain.numpy())
    sigma_sq, mu_sq = adascale.read().sigma_sq, adascale.read().mu_sq
    assert short == pytest.approx(gain_ratio(sigma_sq, mu_sq, 1.5), rel=1e-6)
    assert 1.0 < short < full
    assert adascale.read().gain == pytest.approx(gain_ratio(sigma_sq, mu_sq, 4.0), rel=1e-6)
