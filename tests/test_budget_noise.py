"""`sweep.budget: noise`: the epochs factor (1 + B/B_noise) / (1 + b0/B_noise) against hand
values and its clamps, the runs a sweep expands to, the one-line refusal without a noise scale,
what each run records, the report's budget column, and advise's predicted cost."""

from __future__ import annotations

import pytest
import yaml
from pydantic import ValidationError

from towerbench.config.grid import budget_factor, budget_params, expand, noise_budget
from towerbench.config.load import load
from towerbench.config.params import SweepGrid
from towerbench.config.run_form import SweepChoice
from towerbench.config.sections import TrainConfig
from towerbench.core.errors import TowerbenchError
from towerbench.tasks.advise.recipe import Measurements, choose_recipe
from towerbench.tasks.report.statistics import budget_reason

# (1 + 512/334) / (1 + 128/334) = (846/334) / (462/334) = 846 / 462
HAND = 846 / 462


def test_the_noise_budget_against_hand_values() -> None:
    assert HAND == pytest.approx(1.8312, abs=1e-4)
    assert noise_budget(334, 128, 512) == pytest.approx(HAND)
    assert f"{noise_budget(334, 128, 512):.2f}" == "1.83"
    # (1 + 256/100) / (1 + 128/100) = 3.56 / 2.28
    assert noise_budget(100, 128, 256) == pytest.approx(3.56 / 2.28)


def test_the_noise_budget_lies_between_equal_epochs_and_equal_updates() -> None:
    assert noise_budget(1e15, 128, 512) == pytest.approx(1.0)  # noise-free: equal epochs
    assert noise_budget(1e-12, 128, 512) == pytest.approx(4.0)  # all noise: equal updates
    for noise in (1e-300, 1.0, 50.0, 334.0, 1e6, 1e300):
        assert 1.0 <= noise_budget(noise, 128, 512) <= 4.0
        assert 0.5 <= noise_budget(noise, 128, 64) <= 1.0  # a batch below b0: fewer epochs
    assert noise_budget(334, 128, 128) == 1.0
    with pytest.raises(ValueError, match="positive and finite"):
        noise_budget(0.0, 128, 512)


def test_budget_factor_per_budget_and_adascale_keeps_its_own() -> None:
    assert budget_factor(512, 128, "sqrt", "epochs") == 1.0
    assert budget_factor(512, 128, "sqrt", "updates") == 4.0
    assert budget_factor(512, 128, "sqrt", "noise", 334) == pytest.approx(HAND)
    assert budget_factor(512, 128, "adascale", "noise", 334) == 1.0
    assert budget_factor(512, 128, "adascale", "updates") == 1.0


def _sweep(**values) -> SweepGrid:
    fixed = {"towers": [1, 4], "seeds": [0], "per_tower_batch": 128, "warmup_epochs": [1.0]}
    return SweepGrid(**{**fixed, **values})


def test_a_noise_budget_sweep_stretches_every_epoch_counted_setting() -> None:
    train = TrainConfig(
        reference_batch=128, epochs=4, decay="piecewise", decay_boundaries=[2.0, 3.0]
    )
    sweep = _sweep(lr_scaling=["sqrt", "adascale"], budget="noise", noise_scale=334)
    runs = {(c.towers, c.lr_scaling): c for c in expand(train, sweep)}
    one, four = runs[(1, "none")], runs[(4, "sqrt")]
    assert (one.epochs, one.decay_boundaries) == (4, [2.0, 3.0])  # at b0: factor 1
    assert four.epochs == pytest.approx(4 * HAND)
    assert four.warmup_epochs == pytest.approx(HAND)
    assert four.decay_boundaries == pytest.approx([2 * HAND, 3 * HAND])
    assert four.decay_epochs == pytest.approx(train.decay_epochs * HAND)
    assert runs[(4, "adascale")].epochs == 4  # tau: its own budget
    updates = {c.towers: c for c in expand(train, _sweep(lr_scaling=["sqrt"], budget="updates"))}
    assert one.epochs < four.epochs < updates[4].epochs == 16


def test_each_run_records_its_budget_factor_and_noise_scale() -> None:
    sweep = _sweep(lr_scaling=["sqrt"], budget="noise", noise_scale=334)
    four = [c for c in expand(TrainConfig(reference_batch=128), sweep) if c.towers == 4][0]
    assert budget_params(four, sweep.budget, sweep.noise_scale) == {
        "budget": "noise",
        "budget_factor": "1.83117",
        "budget_noise_scale": "334",
    }
    assert budget_params(four, "updates", None) == {"budget": "updates", "budget_factor": "4"}


def test_a_noise_budget_without_its_noise_scale_is_refused_in_one_line(tmp_path) -> None:
    with pytest.raises(ValidationError, match="run `towerbench advise`"):
        SweepGrid(budget="noise")
    with pytest.raises(ValidationError, match="greater than 0"):
        SweepGrid(budget="noise", noise_scale=0)
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump({"sweep": {"budget": "noise"}}))
    with pytest.raises(TowerbenchError) as refused:
        load(path, resolve_tracking=False)
    message = str(refused.value)
    assert "\n" not in message and "sweep" in message and "sweep.noise_scale" in message
    path.write_text(yaml.safe_dump({"sweep": {"budget": "noise", "noise_scale": 334}}))
    assert load(path, resolve_tracking=False).sweep.noise_scale == 334


def test_the_run_form_offers_the_noise_budget() -> None:
    assert "noise" in str(SweepChoice.model_json_schema()["properties"]["budget"])
    assert SweepChoice(budget="noise").budget == "noise"  # its noise scale: file or advanced


def test_the_report_says_which_budget_each_configuration_trained() -> None:
    one = TrainConfig(global_batch=128, reference_batch=128, epochs=4)
    four = one.model_copy(update={"towers": 4, "global_batch": 512, "lr_scaling": "sqrt"})
    assert budget_reason(four, one) == "equal epochs"
    assert budget_reason(four.model_copy(update={"epochs": 16}), one) == (
        "equal updates (4× the epochs)"
    )
    noise = budget_reason(four.model_copy(update={"epochs": 4 * HAND}), one)
    assert noise == (
        "the noise scale's: 1.83× the epochs = (1 + 512/334) / (1 + 128/334) at noise scale 334"
    )
    adascale = four.model_copy(update={"lr_scaling": "adascale"})
    assert budget_reason(adascale, one).startswith("AdaScale's own")


def test_advise_chooses_the_noise_budget_and_predicts_its_steps_and_time() -> None:
    measured = Measurements(
        towers=4, per_tower_batch=128, reference_batch=128, base_lr=0.1, epochs=4,
        has_batchnorm=False, noise_scale=334, train_examples=50_000, step_seconds=0.5,
        device_kind="logical CPU",
    )  # fmt: skip
    recipe = choose_recipe(measured)
    assert recipe.budget.value == "noise" and recipe.noise_scale == 334
    assert "= 1.83× the epochs" in recipe.budget.reason
    prediction = recipe.prediction
    # 4 x 1.8312 epochs of ceil(50000 / 512) = 98 steps; the reference 4 x 391.
    assert prediction.steps == round(4 * HAND * 98) == 718
    assert prediction.reference_steps == 4 * 391
    assert prediction.seconds == pytest.approx(718 * 0.5)
    assert recipe.lines()[-1].startswith("cost: predicted 718 optimizer steps")
    assert "prediction; towers are logical devices" in recipe.lines()[-1]
    on_gpus = choose_recipe(Measurements(**{**measured.__dict__, "device_kind": "physical GPU"}))
    assert "logical" not in on_gpus.prediction.text()
    untimed = choose_recipe(Measurements(**{**measured.__dict__, "train_examples": None}))
    assert untimed.prediction is None and not untimed.lines()[-1].startswith("cost")
