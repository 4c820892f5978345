"""towerbench.keras.recipe: a recipe file advise wrote, as the Keras optimizer, epochs, global
batch and callbacks of a user's own `fit`, following the trainer's LR at every step."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import fixtures_model
import keras
import numpy as np
import pytest
import tensorflow as tf

import towerbench.keras
from towerbench.config.advise import AdviseConfig, verification_configs
from towerbench.config.load import load
from towerbench.config.params import Params
from towerbench.config.recipe_file import CHOICES, LATER_CHOICES, Choice
from towerbench.core.errors import TowerbenchError
from towerbench.flows.advise import recipe_runs
from towerbench.model.adascale import reference_schedule
from towerbench.model.input_pipeline import EpochPlan
from towerbench.model.keras_adascale import AdaScaleProgress
from towerbench.model.schedules import StepSchedule, schedule_from_config
from towerbench.tasks.advise.advice import (
    Advice,
    recipe_document,
    recipe_params,
    write_params_file,
)
from towerbench.tasks.advise.recipe import Measurements, choose_recipe

pytestmark = pytest.mark.usefixtures("fit_garbage_collected")

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = 1000


def _recipe_file(
    folder: Path, optimizer: str, values: dict[str, float], noise_scale: float = 1000.0
) -> Path:
    """The file advise writes for 4 towers of 32 against 1 tower of 32, from a probe that
    measured `noise_scale`: at 1,000 a gain of 3.7, linear (sqrt for Adam), and a noise budget
    of 3.28 epochs; at 200 a gain of 2.8, far from either rule: adascale."""
    train = {"dataset": "digits", "epochs": 3, "reference_batch": 32, "decay": "constant"}
    train |= {"optimizer": optimizer, "base_lr": 0.05, "weight_decay": 0.0, **values}
    params = Params.model_validate({"train": train, "sweep": {"per_tower_batch": 32}})
    measured = Measurements(
        towers=4,
        per_tower_batch=32,
        reference_batch=32,
        base_lr=0.05,
        epochs=3,
        has_batchnorm=False,
        noise_scale=noise_scale,
        largest_stable_lr=10.0,
        decay="constant",
        optimizer=optimizer,
        optimizer_values=tuple(values.items()),
        train_examples=EXAMPLES,
    )
    recipe = choose_recipe(measured)
    train_config, grid = recipe_runs(params, AdviseConfig(towers=4), recipe)
    sections = recipe_params(params, train_config, grid)
    return write_params_file(folder, "0123456789abcdef", sections, recipe.lines())


def _lr_at(learning_rate, step: float) -> float:
    return float(learning_rate(step)) if callable(learning_rate) else float(learning_rate)


def _trainers_run(path: Path):
    """The K-tower run the trainer verifies for this recipe file, and its LR by step."""
    params = load(path, resolve_tracking=False)
    config = verification_configs(params.train, params.sweep)[-1]
    plan = EpochPlan(EXAMPLES, config.global_batch, config.replicas, config.workers)
    return config, plan, StepSchedule(schedule_from_config(config), plan.steps)


@pytest.mark.parametrize(
    ("optimizer", "values", "rule"),
    [("momentum", {"momentum": 0.9}, "linear"), ("adam", {"beta_1": 0.9, "beta_2": 0.999}, "sqrt")],
)
def test_the_recipe_is_the_trainers_k_tower_run_as_keras_objects(
    tmp_path: Path, optimizer: str, values: dict[str, float], rule: str
) -> None:
    path = _recipe_file(tmp_path, optimizer, values)
    recipe = towerbench.keras.recipe(path, train_examples=EXAMPLES)
    config, plan, trainers_lr = _trainers_run(path)
    assert config.lr_scaling == rule and config.towers == 4
    assert (recipe.global_batch, recipe.replicas) == (128, 4)
    assert recipe.steps_per_epoch == plan.steps == 8
    # The noise budget stretches 3 epochs to a fraction: fit runs whole epochs, stopped early.
    assert recipe.steps == round(config.epochs * plan.steps) and config.epochs % 1 != 0
    assert recipe.epochs == -(-recipe.steps // plan.steps)
    assert [type(c).__name__ for c in recipe.callbacks] == ["StopAtStep"]
    assert recipe.callbacks[0].steps == recipe.steps
    for step in range(recipe.steps + 2):
        assert _lr_at(recipe.learning_rate, step) == pytest.approx(
            float(trainers_lr(step)), rel=1e-6
        )
    effective = config.optimizer_hyperparameters().items()
    assert effective and all(
        float(getattr(recipe.optimizer, name)) == pytest.approx(value)
        for name, value in effective.items()
    )
    assert type(recipe.optimizer).__name__ == {"momentum": "SGD", "adam": "Adam"}[optimizer]
    assert recipe.advise_run_id == "0123456789abcdef"
    assert list(recipe.reasons) == [*CHOICES, *LATER_CHOICES]
    assert recipe.reasons["scaling"].value == rule and recipe.reasons["scaling"].reason
    assert any(line.startswith(f"scaling: {rule} — ") for line in recipe.lines())


def test_what_is_not_a_recipe_is_refused_in_one_line(tmp_path: Path) -> None:
    plain = tmp_path / "params.yaml"
    plain.write_text("train: {dataset: digits}\n")
    cases = {
        tmp_path / "missing.yaml": "missing.yaml: no such file",
        plain: "params.yaml: not a recipe file `towerbench advise` wrote (no its first line)",
    }
    for path, said in cases.items():
        with pytest.raises(TowerbenchError) as refused:
            towerbench.keras.recipe(path, train_examples=EXAMPLES)
        assert said in str(refused.value) and "\n" not in str(refused.value)
    path = _recipe_file(tmp_path, "momentum", {"momentum": 0.9})
    for wrong in (0, 2.5, "1000"):
        with pytest.raises(TowerbenchError, match=r"^train_examples: "):
            towerbench.keras.recipe(path, train_examples=wrong)  # type: ignore[arg-type]


def _fit(recipe: towerbench.keras.KerasRecipe) -> tuple[keras.Model, keras.callbacks.History]:
    """A user's `fit` on 4 logical CPUs with the recipe, on a task a linear model can learn."""
    strategy = fixtures_model.mirrored_strategy()
    rng = np.random.default_rng(0)
    features = rng.normal(size=(EXAMPLES, 8)).astype("float32")
    labels = (features[:, 0] + features[:, 1] > 0).astype("int32")
    with strategy.scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)])
        model.compile(
            optimizer=recipe.optimizer,
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
    data = tf.data.Dataset.from_tensor_slices((features, labels)).batch(recipe.global_batch)
    history = model.fit(data, epochs=recipe.epochs, callbacks=recipe.callbacks, verbose=0)
    return model, history


@pytest.mark.slow
def test_fit_under_mirrored_strategy_follows_the_recipe_to_its_last_step(tmp_path: Path) -> None:
    """A user's `fit` on 4 logical CPUs with the recipe: it stops at the recipe's step count,
    its LR there is the trainer's, and the model learns."""
    path = _recipe_file(tmp_path, "momentum", {"momentum": 0.9})
    recipe = towerbench.keras.recipe(path, train_examples=EXAMPLES)
    model, history = _fit(recipe)
    assert int(model.optimizer.iterations.numpy()) == recipe.steps
    _, _, trainers_lr = _trainers_run(path)
    assert float(model.optimizer.learning_rate) == pytest.approx(
        float(trainers_lr(recipe.steps)), rel=1e-6
    )
    assert history.history["accuracy"][-1] > 0.9


@pytest.mark.slow
def test_towerbench_keras_imports_no_orchestration_library() -> None:
    script = (
        "import sys, towerbench.keras; "
        "print(json.dumps(sorted(m for m in ('prefect', 'mlflow', 'dvc') if m in sys.modules)))"
    )
    completed = subprocess.run(
        [sys.executable, "-c", "import json; " + script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(completed.stdout.splitlines()[-1]) == []


def test_an_adascale_recipe_wraps_the_optimizer_and_ends_at_the_trainers_progress(
    tmp_path: Path,
) -> None:
    path = _recipe_file(tmp_path, "momentum", {"momentum": 0.9}, noise_scale=200.0)
    recipe = towerbench.keras.recipe(path, train_examples=EXAMPLES)
    config, plan, _ = _trainers_run(path)
    assert config.lr_scaling == "adascale" and recipe.reasons["scaling"].value == "adascale"
    # The reference: 1 tower of 32 for 3 epochs, 32 steps an epoch (1000 examples).
    assert recipe.steps == 3 * 32 and recipe.epochs == -(-recipe.steps // plan.steps)
    (progress,) = recipe.callbacks
    assert isinstance(progress, AdaScaleProgress) and progress.reference_steps == recipe.steps
    optimizer = recipe.optimizer
    assert isinstance(optimizer, towerbench.keras.AdaScale) and optimizer.power == 1.0
    assert (optimizer.reference_batch, optimizer.global_batch) == (32, 128)
    trainers = reference_schedule(config.base_lr, schedule_from_config(config))
    exported = optimizer.inner_optimizer._learning_rate.reference
    for tau in np.arange(0, recipe.steps + 1, 0.25):  # the reference schedule, read at tau
        assert _lr_at(exported, tau) == pytest.approx(float(trainers(tau / 32)), rel=1e-6)


@pytest.mark.slow
def test_fit_with_an_adascale_recipe_ends_when_tau_reaches_the_reference_steps(
    tmp_path: Path,
) -> None:
    path = _recipe_file(tmp_path, "momentum", {"momentum": 0.9}, noise_scale=200.0)
    recipe = towerbench.keras.recipe(path, train_examples=EXAMPLES)
    model, history = _fit(recipe)
    progress = history.history["adascale_progress"]
    assert progress[-1] >= recipe.steps > progress[-1] - 4  # stopped at the first step past it
    steps = int(model.optimizer.iterations.numpy())
    assert recipe.steps / 4 <= steps < recipe.steps  # gains between 1 and S = 4, not all 1
    assert all(1.0 <= gain <= 4.0 for gain in history.history["adascale_gain"])


def test_advice_takes_its_recipe_home(tmp_path: Path) -> None:
    """`towerbench.advise(...)`'s Advice: typed choices (value and reason each), and
    `.keras(train_examples=N)` gives the recipe file's KerasRecipe."""
    path = _recipe_file(tmp_path, "momentum", {"momentum": 0.9})
    measured = Measurements(
        towers=4, per_tower_batch=32, reference_batch=32, base_lr=0.05, epochs=3,
        has_batchnorm=False, noise_scale=1000.0, decay="constant", optimizer="momentum",
        optimizer_values=(("momentum", 0.9),), train_examples=EXAMPLES,
    )  # fmt: skip
    choices = recipe_document(choose_recipe(measured))
    advice = Advice(
        advise_run_id="0123456789abcdef",
        params_file=str(path),
        probe={},
        measurements={},
        recipe=choices,
        lines=[],
    )
    assert isinstance(choices.lr_scaling, Choice) and choices.lr_scaling.value == "linear"
    assert choices.optimizer.hyperparameters == {"momentum": 0.9}
    assert choices.prediction is not None and choices.prediction.steps > 0
    taken = advice.keras(train_examples=EXAMPLES)
    assert taken.steps == towerbench.keras.recipe(path, train_examples=EXAMPLES).steps
    assert taken.reasons["scaling"] == Choice("linear", choices.lr_scaling.reason)
    document = advice.model_dump(mode="json")["recipe"]  # the --json document's shape
    assert document["optimizer"]["hyperparameters"] == {"momentum": 0.9}
    assert document["budget"]["value"] == "noise" and document["budget"]["noise_scale"] == 1000.0
