"""The recipe chosen from given measurements: a table of cases, each reason quoting its number."""

import math
import subprocess
import sys

import pytest

from towerbench.tasks.advise.recipe import Measurements, choose_recipe, predicted_gain

# The tutorial network's CIFAR-10 setting (README): 4 towers of 128 against the reference 128 at
# base LR 0.1; the probe's instability above the stable LR quoted in the reasons.
LRN = dict(towers=4, per_tower_batch=128, reference_batch=128, base_lr=0.1, epochs=10)
DIVERGED = "cross-entropy 2.9 above ln 10 at LR 0.4"

CASES = {
    # cure-updates: noise scale 196 -> gain 1.83, nearest sqrt; linear 0.4 diverged.
    "LRN, batch above the noise scale": (
        dict(
            LRN,
            epochs=5,
            has_batchnorm=False,
            noise_scale=196,
            largest_stable_lr=0.3,
            instability=DIVERGED,
            decay="constant",
        ),
        ("sqrt", 1.0, "noise", "linear"),
        [
            "global batch 512 is 2.6× the noise scale 196 (probe)",
            "predicted gain 1.83 of 4, within 25% of sqrt's 2.00",
            f"linear's LR 0.4 is above the largest stable LR 0.3 at batch 512 ({DIVERGED})",
            # (1 + 512/196) / (1 + 128/196) = 708 / 324 = 2.185
            "equal progress needs (1 + B/B_noise) / (1 + b0/B_noise) = 2.19× the epochs "
            "(McCandlish et al.): 10.9 epochs, against 20 for equal updates and 5 for equal "
            "epochs",
            "constant leaves the LR at 1× its peak after 5 epochs: decay it linearly to 0",
        ],
    ),
    # cure-bn: 9228 -> gain 3.84, linear; 4 / 3.84 = 1.04 times the epochs: equal epochs.
    "BatchNorm, batch well below the noise scale": (
        dict(
            LRN,
            epochs=12,
            has_batchnorm=True,
            noise_scale=9228,
            noise_scale_source="final value",
            decay="linear",
        ),
        ("linear", 2.0, "noise", "linear"),
        [
            "global batch 512 is well below the noise scale 9228 (final value)",
            "within 25% of linear's 4.00",
            "warm up over 2 of 12 epochs",
            "= 1.04× the epochs (McCandlish et al.): 12.5 epochs, against 48 for equal updates",
            "linear ends at 0× the peak LR: annealed, kept",
        ],
    ),
    # 1024 -> gain exactly 3: 33% from linear 4, 50% from sqrt 2.
    "gain between sqrt and linear": (
        dict(LRN, has_batchnorm=True, noise_scale=1024),
        ("adascale", 0.0, "tau", "linear"),
        [
            "predicted gain 3.00 of 4: no fixed rule within 25% (linear 4.00, sqrt 2.00)",
            "Johnson et al. train without warmup",
            "between 10 and 40 epochs",
            "decay it linearly to 0, evaluated at tau (in reference epochs)",
        ],
    ),
    "adascale's LR above the stable LR": (
        dict(LRN, has_batchnorm=True, noise_scale=1024, largest_stable_lr=0.25),
        ("sqrt", 1.5, "noise", "linear"),
        [
            "the nearest stable rule is sqrt (2.00)",
            "adascale's LR 0.3 is above the largest stable LR 0.25",
            "warm up over 1.5 of 10 epochs",
            "= 1.33× the epochs",
        ],
    ),
    "no LR is stable": (
        dict(LRN, has_batchnorm=False, noise_scale=196, largest_stable_lr=0.15),
        ("none", 0.0, "noise", "linear"),
        ["even sqrt's LR 0.2 is above the largest stable LR 0.15 at batch 512: keep the base LR"],
    ),
    "not even the base LR is stable": (
        dict(LRN, has_batchnorm=False, noise_scale=196, largest_stable_lr=0.0),
        ("none", 0.0, "noise", "linear"),
        [
            "not even the base LR 0.1 was stable at batch 512",
            "lower train.base_lr from 0.1 to 0.01 (a tenth: the probe found no LR stable at "
            "batch 512)",
        ],
    ),
    "one tower": (
        dict(LRN, towers=1, has_batchnorm=False, noise_scale=196),
        ("none", 0.0, "epochs", "linear"),
        ["global batch 128 is not above the reference batch 128"],
    ),
    "no noise scale, BatchNorm": (
        dict(LRN, has_batchnorm=True, noise_scale=math.nan, decay="cosine"),
        ("linear", 1.5, "updates", "cosine"),
        ["no noise scale measured; BatchNorm networks nearly follow the linear rule"],
    ),
    "no noise scale, no BatchNorm": (
        dict(LRN, has_batchnorm=False, decay="staircase", decay_epochs=3),
        ("sqrt", 1.5, "updates", "staircase"),
        ["without BatchNorm the linear rule is unreliable", "staircase ends at 0.001×"],
    ),
    "piecewise decay within the budget": (
        dict(
            LRN,
            has_batchnorm=True,
            noise_scale=9228,
            decay="piecewise",
            decay_boundaries=(5.0, 8.0),
        ),
        ("linear", 1.5, "noise", "piecewise"),
        ["piecewise ends at 0.01× the peak LR: annealed, kept"],
    ),
}


@pytest.mark.parametrize("name", CASES)
def test_recipe_from_measurements(name):
    measured, (rule, warmup, budget, decay), quoted = CASES[name]
    recipe = choose_recipe(Measurements(**measured))
    chosen = (
        recipe.lr_scaling.value,
        recipe.warmup_epochs.value,
        recipe.budget.value,
        recipe.decay.value,
    )
    assert chosen == (rule, warmup, budget, decay)
    text = "\n".join(recipe.lines())
    for phrase in quoted:
        assert phrase in text


def test_predicted_gain_is_adascales_gain_at_that_noise_scale():
    from towerbench.model.adascale import gain_ratio

    # sigma^2 = tr(Sigma)/b0 and |mu|^2 = tr(Sigma)/B_noise: scale |mu|^2 to 1.
    for noise in (20.0, 196.0, 9228.0):
        assert predicted_gain(noise, 128, 512) == pytest.approx(gain_ratio(noise / 128, 1.0, 4))
    assert predicted_gain(1e-9, 128, 512) == pytest.approx(1.0)
    assert predicted_gain(1e12, 128, 512) == pytest.approx(4.0)


def test_recipe_as_params_sections():
    adascale = choose_recipe(Measurements(**dict(LRN, has_batchnorm=True, noise_scale=1024)))
    assert adascale.sections() == {
        "train": {"decay": "linear"},
        "sweep": {"lr_scaling": ["adascale"], "warmup_epochs": [0.0], "budget": "epochs"},
    }
    sqrt = choose_recipe(Measurements(**CASES["LRN, batch above the noise scale"][0]))
    assert sqrt.sections()["sweep"] == {
        "lr_scaling": ["sqrt"],
        "warmup_epochs": [1.0],
        "budget": "noise",
        "noise_scale": 196,
    }
    unmeasured = choose_recipe(Measurements(**dict(LRN, has_batchnorm=True)))
    assert unmeasured.sections()["sweep"]["budget"] == "updates"
    assert "noise_scale" not in unmeasured.sections()["sweep"]


def test_bad_measurements_are_refused_by_name():
    with pytest.raises(ValueError, match="per_tower_batch must be positive"):
        Measurements(**dict(LRN, per_tower_batch=0, has_batchnorm=True))


@pytest.mark.slow
def test_choosing_a_recipe_loads_no_tensorflow():
    script = "import sys, towerbench.tasks.advise.recipe\nprint('tensorflow' in sys.modules)\n"
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"


ADAM = dict(
    towers=4,
    per_tower_batch=128,
    reference_batch=128,
    base_lr=0.001,
    epochs=10,
    has_batchnorm=True,
    optimizer="adam",
    optimizer_values=(("beta_1", 0.9), ("beta_2", 0.999), ("epsilon", 1e-7)),
)


def test_an_adaptive_optimizer_never_gets_the_linear_rule():
    """Well below the noise scale SGD would scale linearly (cure-bn); Adam's LR factor is the
    gain to the power 1/2 = 1.96, sqrt's 2: the square-root rule, with its betas and epsilon."""
    recipe = choose_recipe(Measurements(**dict(ADAM, noise_scale=9228)))
    assert recipe.lr_scaling.value == "sqrt"
    assert "an LR factor of 1.96 for an adaptive optimizer" in recipe.lr_scaling.reason
    assert recipe.hyperparameters == pytest.approx(
        {"beta_1": 0.6, "beta_2": 0.996, "epsilon": 5e-8}
    )
    assert "the square-root rule (Malladi et al. 2022) at k = 4" in recipe.optimizer.reason
    assert choose_recipe(Measurements(**ADAM)).lr_scaling.value == "sqrt"  # no noise scale


def test_adamscale_when_the_adaptive_gain_is_far_from_sqrt():
    """Noise scale 128: gain 1.6, to the power 1/2 1.26, 37% from sqrt's 2."""
    recipe = choose_recipe(Measurements(**dict(ADAM, noise_scale=128)))
    assert recipe.lr_scaling.value == "adascale"
    assert "AdaScale's gain to the power 1/2 (AdamScale)" in recipe.optimizer.reason
    assert recipe.hyperparameters == {"beta_1": 0.9, "beta_2": 0.999, "epsilon": 1e-7}


@pytest.mark.parametrize(("optimizer", "layer_wise"), [("adam", "lamb"), ("momentum", "lars")])
def test_the_layer_wise_optimizer_is_named_when_no_rule_is_stable(optimizer, layer_wise):
    measured = dict(ADAM, optimizer=optimizer, noise_scale=9228, largest_stable_lr=0.001)
    measured["optimizer_values"] = () if optimizer == "momentum" else ADAM["optimizer_values"]
    recipe = choose_recipe(Measurements(**measured))
    assert recipe.lr_scaling.value == "none"
    assert f"no rule scaled the LR stably: {layer_wise} gives each layer" in recipe.optimizer.reason


BN_LAG = dict(LRN, has_batchnorm=True, noise_scale=9228, batch_norm_steps=40)


@pytest.mark.parametrize(
    ("measured", "value", "quoted"),
    [
        (dict(LRN, has_batchnorm=False), "moving", "no BatchNorm"),
        (dict(BN_LAG), "moving", "no stable LR trial measured its lag"),
        (
            dict(BN_LAG, accuracy_moving_bn=0.412, accuracy_recomputed_bn=0.883),
            "ema_rule",
            "after the probe's 40 steps at batch 512, training batches scored 41.2% with the "
            "moving statistics and 88.3% re-estimated at the weights (+47.1 pp): they move once "
            "per step, and batch 512 makes 4× fewer; the EMA rule raises BatchNorm's momentum m "
            "to m^4",
        ),
        (
            dict(BN_LAG, accuracy_moving_bn=0.880, accuracy_recomputed_bn=0.883),
            "moving",
            "(+0.3 pp): no lag worth curing",
        ),
        (
            dict(BN_LAG, towers=1, accuracy_moving_bn=0.5, accuracy_recomputed_bn=0.8),
            "recomputed",
            "evaluate with statistics re-estimated at the weights",
        ),
    ],
)
def test_batchnorms_measured_lag_chooses_its_statistics(measured, value, quoted):
    recipe = choose_recipe(Measurements(**measured))
    assert recipe.batch_norm.value == value
    assert f"batchnorm statistics: {value} — " in "\n".join(recipe.lines())
    assert quoted in recipe.batch_norm.reason
    train = recipe.sections()["train"]
    assert train.get("ema_scaling") == ("ema_rule" if value == "ema_rule" else None)
    assert train.get("eval_bn") == ("recomputed" if value == "recomputed" else None)


@pytest.mark.parametrize(
    ("lag", "setting"), [(0.5, ("ema_rule", "moving")), (0.0, ("none", "moving"))]
)
def test_the_verified_runs_take_the_recipes_batchnorm_statistics(lag, setting):
    from towerbench.config.advise import AdviseConfig, verification_configs
    from towerbench.config.load import load
    from towerbench.flows.advise import recipe_runs

    measured = dict(BN_LAG, accuracy_moving_bn=0.4, accuracy_recomputed_bn=0.4 + lag)
    recipe = choose_recipe(Measurements(**measured))
    train, grid = recipe_runs(load(None, []), AdviseConfig(towers=4), recipe)
    for run in verification_configs(train, grid):
        assert (run.ema_scaling, run.eval_bn) == setting
