"""`towerbench advise`: the probe's stop on divergence (real TensorFlow on the digits), the
verdict's arithmetic, and the command on digits with and without its verification sweep."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import fixtures_model
import pytest
import yaml
from fixtures_servers import untraced_prefect_harness

import towerbench.keras
from towerbench.config.advise import AdviseConfig, verification_configs
from towerbench.config.grid import expand
from towerbench.config.load import load
from towerbench.config.recipe_file import CHOICES, LATER_CHOICES
from towerbench.config.sections import TrainConfig
from towerbench.core.outcome import ConfigSummary, Status, SweepResult
from towerbench.model.probe import WINDOW, NoiseProbe, ProbeResult, divergence, probe
from towerbench.tasks.advise.advice import probe_document, verdict_section
from towerbench.tasks.advise.probe import settled_noise_scale
from towerbench.tasks.advise.recipe import Measurements, choose_recipe
from towerbench.tasks.advise.verdict import verify_outcome

ROOT = Path(__file__).resolve().parents[1]
CHANCE = math.log(10)


def test_divergence_waits_for_a_window_and_allows_the_starting_plateau() -> None:
    assert divergence([CHANCE + 0.5] * (WINDOW - 1), 10) is None  # too few steps to judge
    assert divergence([CHANCE * 1.01] * WINDOW, 10) is None  # the plateau a network starts on
    assert "rose above chance level ln 10" in divergence([2.0] * 5 + [3.0] * WINDOW, 10)
    assert "not a number at step 3" in divergence([2.3, 2.2, math.nan], 10)


@pytest.fixture(scope="module")
def digits_dir(tmp_path_factory) -> Path:
    return fixtures_model.write_digits(tmp_path_factory.mktemp("data"), train=400, test=100)


@pytest.mark.slow
def test_the_probe_stops_a_diverging_lr_and_tries_no_larger_one(digits_dir: Path) -> None:
    config = TrainConfig(dataset="digits", global_batch=32, reference_batch=32, base_lr=0.02)
    result = probe(config, digits_dir, towers=2, learning_rates=[0.02, 40.0, 80.0], steps=60)
    stable, diverged = result.trials  # 80 was not tried once 40 diverged
    assert (stable.learning_rate, stable.steps, stable.diverged) == (0.02, 60, None)
    assert diverged.learning_rate == 40.0 and diverged.steps < 60, diverged
    assert "chance level ln 10" in diverged.diverged or "not a number" in diverged.diverged
    assert result.largest_stable_lr == 0.02 and result.instability.startswith("at LR 40: ")
    noise = result.noise  # 60 steps at batch 32, each as 4 micro-batches of 8
    assert (noise.steps, noise.batch, noise.micro_batch) == (60, 32, 8)
    assert noise.noise_scale is not None and noise.noise_scale > 0
    assert result.has_batchnorm is False
    assert len(set(result.tower_devices)) == 2  # the LR trials ran as a 2-tower run does
    kept = json.dumps(probe_document(result))  # as the advise run keeps it, NaN losses included
    assert json.dumps(probe_document(ProbeResult.from_document(json.loads(kept)))) == kept


def _noise(along: list[float]) -> ProbeResult:
    samples = [(10 * (index + 1), value) for index, value in enumerate(along)]
    noise = NoiseProbe(along[-1], 32, 8, 50, 0.02, 2.3, 1.2, samples)
    return ProbeResult(False, 10, noise, [], 1.0)


def test_the_recipe_uses_the_noise_scale_only_once_it_has_settled() -> None:
    value, source = settled_noise_scale(_noise([40.0, 90.0, 120.0]))
    assert value == pytest.approx(3 / (1 / 40 + 1 / 90 + 1 / 120))  # the report's rule
    assert source.startswith("harmonic mean of its values along 50 probe steps")
    assert "(40 -> 90 -> 120;" in source
    for unsettled in ([-142.0, 721.0, 239.0], [50.0, 30.0, 200.0], [80.0]):
        value, source = settled_noise_scale(_noise(unsettled))
        assert value is None and source.startswith("not settled after 50 steps"), unsettled


def _summary(towers: int, seed: int, accuracy: float, wall_time: float) -> ConfigSummary:
    return ConfigSummary(
        status=Status.COMPLETED,
        test_accuracy=accuracy,
        wall_time=wall_time,
        run_id=f"r{towers}{seed}",
        name=f"towers={towers} seed={seed}",
        towers=towers,
        workers=1,
        seed=seed,
    )


RECIPE = choose_recipe(
    Measurements(
        towers=4, per_tower_batch=32, reference_batch=32, base_lr=0.02, epochs=4,
        has_batchnorm=False, noise_scale=2000.0,
    )
)  # fmt: skip


def _sweep(many: list[float], ones: tuple[float, ...] = (0.90, 0.91, 0.92)) -> SweepResult:
    configs = [_summary(1, seed, a, 10.0) for seed, a in enumerate(ones)]
    configs += [_summary(4, seed, a, 25.0) for seed, a in enumerate(many)]
    return SweepResult(parent_run_id="p", mlflow_url="u", configs=configs, report="r.md")


def test_the_verdict_says_whether_the_recipe_reached_one_tower_and_what_it_cost() -> None:
    tight = (0.910, 0.911, 0.912)
    reached = verify_outcome(_sweep([0.9105, 0.9115, 0.911], tight), RECIPE)
    assert reached.reached and reached.verdict.startswith(
        "the recipe reached the 1-tower accuracy: Δ +0.0 pp, 95% CI [−"
    )
    assert "(the interval lies above −1 pp)" in reached.verdict
    assert "took 2.50× the 1-tower time" in reached.verdict and reached.time_ratio == 2.5
    # Within 1 pp on average, as the old rule had it "reached", but the interval is ±2 pp.
    close = verify_outcome(_sweep([0.905, 0.915, 0.91]), RECIPE)
    assert close.outcome == "inconclusive" and not close.reached
    missed = verify_outcome(_sweep([0.85, 0.86, 0.87]), RECIPE)
    assert not missed.reached and missed.verdict.startswith(
        "the recipe did not reach the 1-tower accuracy: Δ −5.0 pp, 95% CI ["
    )
    assert "next thing to try: " in missed.verdict and missed.outcome == "missed"
    assert missed.difference_pp == pytest.approx(-5.0)
    # 5 pp below on average, but one seed as good as 1 tower: the interval reaches 0.
    unsure = verify_outcome(_sweep([0.92, 0.80, 0.86]), RECIPE)
    assert unsure.outcome == "inconclusive" and not unsure.reached
    assert unsure.verdict.startswith("inconclusive: Δ −5.0 pp, 95% CI [−")
    assert "seeds per side would decide it at the measured spread" in unsure.verdict
    assert unsure.seeds_needed is not None and unsure.seeds_needed > 3


def test_the_verdict_of_a_recipe_judged_by_mae_is_in_mae() -> None:
    def mae(summary: ConfigSummary) -> ConfigSummary:  # the accuracy given read as an MAE
        value = summary.test_accuracy
        return summary.model_copy(
            update={"metric": "mae", "test_metric": value, "test_accuracy": None}
        )

    ones = (0.300, 0.302, 0.304)
    worse = _sweep([0.330, 0.333, 0.336], ones)
    worse = worse.model_copy(update={"configs": [mae(config) for config in worse.configs]})
    missed = verify_outcome(worse, RECIPE)
    assert missed.outcome == "missed" and missed.metric == "mae"
    assert missed.verdict.startswith(
        "the recipe did not reach the 1-tower MAE: Δ +0.031, 95% CI [+"
    )
    # Held against 1% of 1 tower's MAE, above which an error is worse.
    assert f"(the interval lies above +{0.01 * 0.302:.3g})" in missed.verdict
    assert missed.difference == pytest.approx(0.031) and missed.difference_pp is None
    assert missed.ci_low < 0.031 < missed.ci_high
    table = verdict_section(missed)
    assert "| Δ MAE vs 1 tower |" in table and "| missed | +0.031 | [+0.0" in table
    assert " pp" not in table


def test_verification_trains_one_tower_and_the_recipe_not_the_mixed_shapes() -> None:
    params = load(None)
    advice = AdviseConfig(towers=2, workers=2, seeds=2)
    from towerbench.config.advise import reference_config, verification_grid

    grid = verification_grid(advice, params, "adascale", 0.0, "epochs")
    configs = verification_configs(reference_config(params), grid)
    shapes = [(c.towers, c.workers, c.lr_scaling, c.seed) for c in configs]
    assert shapes == [(1, 1, "none", 0), (1, 1, "none", 1)] + [
        (2, 2, "adascale", 0),
        (2, 2, "adascale", 1),
    ]
    assert len(expand(reference_config(params), grid)) > len(configs)  # the product has more


PARAMS = """\
data: {data_dir: data}
train: {dataset: digits, epochs: 2, reference_batch: 32, base_lr: 0.02, decay: constant}
sweep: {per_tower_batch: 32}
tracking: {tracking_uri: "sqlite:///mlflow.db"}
report: {report_dir: reports}
"""


# `towerbench` (cli.main.run) saying, as it exits, whether its own process imported TensorFlow.
COMMAND_SAYING_ITS_IMPORTS = (
    "import atexit, sys; from towerbench.cli import main as cli; atexit.register(lambda: print("
    "'tensorflow imported:', 'tensorflow' in sys.modules, file=sys.stderr)); cli.run()"
)


def _advise(
    project: Path, elsewhere: Path, *options: str, env: dict | None = None, status: int = 0
):
    """`towerbench advise --params project/params.yaml OPTIONS --json` in its own process
    (exiting with `status`); its document, stderr and wall-clock seconds."""
    started = time.perf_counter()
    completed = subprocess.run(
        [sys.executable, "-c", COMMAND_SAYING_ITS_IMPORTS, "advise"]
        + ["--params", str(project / "params.yaml"), "--towers", "2", *options, "--json"],
        cwd=elsewhere,
        env=dict(os.environ, PYTHONPATH=str(ROOT), **(env or {})),
        capture_output=True,
        text=True,
        timeout=900,
    )
    seconds = time.perf_counter() - started
    assert completed.returncode == status, completed.stderr[-3000:]
    return json.loads(completed.stdout), completed.stderr, seconds


@pytest.fixture(scope="module")
def shared_prefect() -> Iterator[dict[str, str]]:
    """One Prefect server for the advise commands that need not start their own (the first test
    keeps the temporary server every command starts alone): PREFECT_API_URL to pass them."""
    from prefect.settings import PREFECT_API_URL

    with untraced_prefect_harness():
        yield {"PREFECT_API_URL": str(PREFECT_API_URL.value())}


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("project")
    fixtures_model.write_digits_project(folder, PARAMS, train=480, test=120)
    return folder


def _check_recipe_file(document: dict) -> None:
    """advise-<id>.yaml loads, carries the chosen recipe, and sweeps what was verified."""
    path = Path(document["params_file"])
    assert path.name == f"advise-{document['advise_run_id'][:8]}.yaml"
    assert path.read_text().startswith("# towerbench advise (MLflow run ")
    params = load(path)
    recipe = document["recipe"]
    assert params.train.lr_scaling == recipe["lr_scaling"]["value"]
    assert params.train.decay == recipe["decay"]["value"]
    assert params.sweep.lr_scaling == [recipe["lr_scaling"]["value"]]
    assert params.sweep.towers == [1, 2] and params.sweep.seeds == [0, 1, 2]
    assert yaml.safe_load(path.read_text())["train"]["global_batch"] == 32
    _check_keras_recipe(path, recipe)


def _check_keras_recipe(path: Path, recipe: dict) -> None:
    """towerbench.keras reads the file back: 2 towers of 32, the advice's choices and reasons,
    the predicted steps (480 examples, 8 steps an epoch; under adascale, the reference's 30
    as the progress that ends it)."""
    taken = towerbench.keras.recipe(path, train_examples=480)
    assert (taken.global_batch, taken.replicas, taken.steps_per_epoch) == (64, 2, 8)
    assert taken.reasons["scaling"].value == recipe["lr_scaling"]["value"]
    assert taken.reasons["budget"].reason == recipe["budget"]["reason"]
    adascale = recipe["lr_scaling"]["value"] == "adascale"
    assert isinstance(taken.optimizer, towerbench.keras.AdaScale) == adascale
    predicted = recipe["prediction"]["reference_steps" if adascale else "steps"]
    assert taken.steps == predicted


@pytest.mark.slow
def test_advise_without_verification_probes_chooses_and_keeps_the_recipe(
    project: Path, tmp_path: Path
) -> None:
    from mlflow.tracking import MlflowClient

    document, stderr, seconds = _advise(project, tmp_path, "--no-verify")
    print(f"advise --no-verify --json: {seconds:.1f} s")  # the README quotes this
    assert "tensorflow imported: False" in stderr  # the probe trains in a process of its own
    probe_result = document["probe"]
    assert probe_result["noise"]["steps"] == 200 and len(probe_result["noise"]["along"]) == 5
    assert [trial["learning_rate"] for trial in probe_result["trials"]][0] == 0.02
    assert document["verification"] is None
    lines = document["lines"]
    assert lines[0].startswith("probe (") and "noise scale " in lines[0]
    assert lines[1].startswith("largest stable LR at batch 64: ")
    assert [line.split(":")[0] for line in lines[2:]] == [*CHOICES, *LATER_CHOICES, "cost"]
    assert document["recipe"]["batch_norm"]["value"] == "moving"  # the tutorial has none
    # The predicted steps and time of the 2-tower run: 480 examples, batch 64 (8 steps an
    # epoch), 2 epochs times the budget's factor, at the probe's measured step time.
    prediction = document["recipe"]["prediction"]
    factor = {"epochs": 1.0, "updates": 2.0}.get(document["recipe"]["budget"]["value"])
    if factor is None:  # noise
        noise = document["recipe"]["budget"]["noise_scale"]
        factor = (1 + 64 / noise) / (1 + 32 / noise)
    assert prediction["steps"] == round(2 * factor * 8) and prediction["reference_steps"] == 30
    assert prediction["step_seconds"] > 0 and prediction["logical"] is True
    assert prediction["seconds"] == pytest.approx(prediction["steps"] * prediction["step_seconds"])
    assert "prediction; towers are logical devices" in lines[-1]
    _check_recipe_file(document)
    client = MlflowClient(f"sqlite:///{project / 'mlflow.db'}")
    run = client.get_run(document["advise_run_id"])
    assert run.info.status == "FINISHED" and run.data.tags["towerbench.kind"] == "advise"
    assert "largest_stable_lr" in run.data.metrics
    artifacts = {item.path for item in client.list_artifacts(run.info.run_id)}
    assert artifacts == {
        "advice.md",
        "advice.html",
        "probe.json",
        Path(document["params_file"]).name,
    }
    kept = client.download_artifacts(run.info.run_id, "probe.json", str(tmp_path))
    assert json.loads(Path(kept).read_text()) == probe_result  # what a re-run would reuse


@pytest.mark.slow
def test_advise_for_adam_chooses_a_rule_that_fits_it(
    project: Path, tmp_path: Path, shared_prefect: dict[str, str]
) -> None:
    """The params file's momentum LR is left out for Adam's own; the probe tries the base LR
    and sqrt's only; the recipe is the square-root rule or AdamScale, with Adam's betas and
    epsilon as the 2-tower run uses them, in the JSON and in advise-<id>.yaml."""
    options = ["--no-verify", "--optimizer", "adam", "--probe-steps", "40"]
    document, stderr, _ = _advise(project, tmp_path, *options, env=shared_prefect)
    assert "--optimizer adam: " in stderr and "train.base_lr (set for momentum) left out" in stderr
    trials = [trial["learning_rate"] for trial in document["probe"]["trials"]]
    assert trials[0] == 0.001 and all(lr <= 0.001 * 2**0.5 * 1.0001 for lr in trials)
    recipe = document["recipe"]
    assert recipe["lr_scaling"]["value"] in ("sqrt", "adascale", "none")
    values = recipe["optimizer"]["hyperparameters"]
    assert recipe["optimizer"]["value"] == "adam" and set(values) == {"beta_1", "beta_2", "epsilon"}
    if recipe["lr_scaling"]["value"] == "sqrt":  # kappa = 2
        assert values == pytest.approx({"beta_1": 0.8, "beta_2": 0.998, "epsilon": 1e-7 / 2**0.5})
    assert load(Path(document["params_file"])).train.optimizer == "adam"


@pytest.mark.slow
def test_advise_verifies_the_recipe_with_a_sweep_and_a_report(
    project: Path, tmp_path: Path, shared_prefect: dict[str, str]
) -> None:
    from mlflow.tracking import MlflowClient

    options = ["--seeds", "2", "--probe-steps", "60"]
    document, stderr, seconds = _advise(project, tmp_path, *options, env=shared_prefect)
    print(f"advise --verify --json: {seconds:.1f} s")
    verification = document["verification"]
    verdict = verification["verdict"]
    assert verdict.startswith(
        ("the recipe reached the 1-tower accuracy: Δ ", "it did not: Δ ", "inconclusive: Δ ")
    )
    assert "95% CI [" in verdict and "× the 1-tower time" in verdict
    assert verification["difference_pp"] is not None
    report = Path(verification["report"])
    assert report.is_file() and report.is_relative_to(project / "reports")
    client = MlflowClient(f"sqlite:///{project / 'mlflow.db'}")
    parent = client.get_run(verification["parent_run_id"])
    assert parent.data.tags["towerbench.flow"] == "advise"
    advice = client.get_run(document["advise_run_id"])
    assert advice.data.tags["towerbench.advise.sweep"] == verification["parent_run_id"]
    assert advice.data.tags["towerbench.advise.verdict"] == verdict
    children = client.search_runs(
        [parent.info.experiment_id],
        filter_string=f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'",
    )
    assert sorted(int(run.data.params["towers"]) for run in children) == [1, 1, 2, 2]


@pytest.mark.slow
def test_advise_when_every_run_diverges_states_no_difference_and_exits_1(
    tmp_path: Path, shared_prefect: dict[str, str]
) -> None:
    """base_lr 50: the probe says to lower train.base_lr and to what; both sides diverge, so
    the verdict compares nothing, repeats that advice, and the command exits 1."""
    project = tmp_path / "project"
    project.mkdir()
    fixtures_model.write_digits_project(
        project, PARAMS.replace("base_lr: 0.02", "base_lr: 50"), train=160, test=40
    )
    options = ["--seeds", "1", "--probe-steps", "20"]
    document, stderr, _ = _advise(project, tmp_path, *options, env=shared_prefect, status=1)
    verification = document["verification"]
    verdict = verification["verdict"]
    assert verification["outcome"] == "diverged" and verification["difference_pp"] is None
    assert verdict.startswith("every recipe run diverged (1/1 at 2 towers")
    assert "the probe's advice: lower train.base_lr from 50 to 5" in verdict
    assert "Δ" not in verdict and "reused" not in verdict and "more epochs" not in verdict
    # Said once, as the command's last line; the advise run and the sweep's runs FAILED.
    from mlflow.tracking import MlflowClient

    said = [line for line in stderr.splitlines() if line.strip()]
    assert said[-1] == f"towerbench advise: error: {verdict}", said[-3:]
    client = MlflowClient(f"sqlite:///{project / 'mlflow.db'}")
    assert client.get_run(document["advise_run_id"]).info.status == "FAILED"
    assert client.get_run(verification["parent_run_id"]).info.status == "FAILED"
