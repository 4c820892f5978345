"""advise's answer where users look: the advice as markdown (probe, recipe table, params file,
verdict with its interval), published as the flow run's Prefect artifact and as advice.md/.html in
the advise MLflow run, which records its dataset and the data version a sweep records (the DVC
hash of a DVC-built dataset)."""

from __future__ import annotations

from pathlib import Path

import fixtures_model
import pytest
import yaml
from fixtures_servers import untraced_prefect_harness
from mlflow.tracking import MlflowClient
from prefect import flow

from towerbench.config.params import Params, TrackingConfig
from towerbench.config.sections import DataConfig, TrainConfig
from towerbench.tasks.advise.advice import (
    advice_data_version,
    advice_markdown,
    finish_advice_run,
    log_advice,
    start_advice_run,
    verdict_section,
    without_asides,
)
from towerbench.tasks.advise.recipe import Measurements, choose_recipe
from towerbench.tasks.advise.verdict import Verification
from towerbench.tasks.data.check import manifest_digest
from towerbench.tasks.data.dvc_stages import data_version, run_dvc
from towerbench.tasks.tracking import ensure_experiment, experiment_name

MEASURED = Measurements(
    towers=4, per_tower_batch=128, reference_batch=128, base_lr=0.1, epochs=4,
    has_batchnorm=False, noise_scale=334, noise_scale_source="probe, 200 steps",
    largest_stable_lr=0.4, train_examples=50_000, step_seconds=0.5, device_kind="logical CPU",
)  # fmt: skip
RECIPE = choose_recipe(MEASURED)
PROBE = ["probe (40 s, 4 tower devices): no BatchNorm; noise scale 334", "largest stable LR: 0.4"]
VERIFIED = Verification(
    parent_run_id="sweep-run", report="/reports/sweep-run/report.md", difference=0.005,
    ci_low=-0.004, ci_high=0.014, outcome="reached", time_ratio=1.25,
    verdict="the recipe reached the 1-tower accuracy: Δ +0.5 pp, 95% CI [−0.4, +1.4]",
)  # fmt: skip


def test_the_advice_says_the_probe_the_recipe_the_params_file_and_the_verdict() -> None:
    text = advice_markdown("advise", MEASURED, RECIPE, Path("/p/advise-1.yaml"), PROBE)
    assert "- probe (40 s, 4 tower devices)" in text
    assert "| noise scale | 334 | probe, 200 steps |" in text
    assert "| largest stable LR at batch 512 | 0.4 | no trial diverged |" in text
    assert "| choice | value | the number behind it |" in text
    budget = RECIPE.budget
    short = without_asides(budget.reason)
    assert f"| budget | {budget.value} | {short} |" in text and "1.83×" in short
    assert f"- **budget: {budget.value}** — {budget.reason}" in text  # the reason in full
    assert f"| LR scaling | {RECIPE.lr_scaling.value} | " in text
    assert "Cost: predicted 718 optimizer steps" in text
    assert "`towerbench sweep --params /p/advise-1.yaml`" in text
    verdict = verdict_section(VERIFIED)
    assert verdict.startswith("## Verdict\n\nthe recipe reached the 1-tower accuracy: Δ +0.5 pp")
    assert "| outcome | Δ accuracy vs 1 tower | 95% CI | time vs 1 tower |" in verdict
    assert "| reached | +0.5 pp | [−0.4, +1.4] pp | 1.25× |" in verdict
    assert "report `/reports/sweep-run/report.md`" in verdict
    assert "Not verified (verification was off)" in verdict_section(None)
    assert "Being verified" in verdict_section(None, verifying=True)


def test_asides_leave_the_table_nested_ones_too() -> None:
    reason = "batch 512 is 1.5× the noise 331 (mean of (296 -> 365; loss 2.2), the rule): gain 2.18"
    assert without_asides(reason) == "batch 512 is 1.5× the noise 331: gain 2.18"
    formula = "needs (1 + B/B_noise) / (1 + b0/B_noise) = 1.84× the epochs (McCandlish et al.)"
    assert without_asides(formula) == "needs (1 + B/B_noise) / (1 + b0/B_noise) = 1.84× the epochs"


def _params(root: Path) -> Params:
    return Params(
        train=TrainConfig(dataset="digits"),
        data=DataConfig(data_dir=str(root / "data")),
        tracking=TrackingConfig(tracking_uri=f"sqlite:///{root / 'mlflow.db'}"),
    )


@flow
def _advise_flow(params: Params, params_file: Path, verification: Verification | None) -> str:
    """What flows/advise.py does around the probe: start, keep the recipe, finish."""
    version = advice_data_version(Path(params.data.data_dir), params.train.dataset)
    experiment_id = ensure_experiment(
        params.tracking, experiment_name(params.tracking, params.train)
    )
    run_id = start_advice_run(params, experiment_id, MEASURED.towers, {}, version)
    lines = [*PROBE, *RECIPE.lines()]
    log_advice(params, run_id, MEASURED, RECIPE, params_file, lines, verifying=True)
    finish_advice_run(params, run_id, verification, "FINISHED")
    return run_id


def _advice_artifacts() -> list[str]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["advice"]))
        )
    return [artifact.data for artifact in sorted(artifacts, key=lambda a: a.created)]


@pytest.mark.slow
def test_an_advise_flow_run_publishes_the_advice_and_records_the_sweeps_data_version(
    tmp_path: Path,
) -> None:
    fixtures_model.write_digits(tmp_path / "data", train=64, test=16, shards=1)
    params = _params(tmp_path)
    params_file = tmp_path / "advise-1.yaml"
    params_file.write_text("train: {}\n")
    with untraced_prefect_harness():
        run_id = _advise_flow(params, params_file, VERIFIED)
        pending, published = _advice_artifacts()
    reason = without_asides(RECIPE.lr_scaling.reason)
    recipe_row = f"| LR scaling | {RECIPE.lr_scaling.value} | {reason} |"
    assert recipe_row in pending and "Being verified" in pending
    assert recipe_row in published and "| reached | +0.5 pp | [−0.4, +1.4] pp |" in published
    assert "Being verified" not in published

    client = MlflowClient(params.tracking.tracking_uri)
    artifacts = {item.path for item in client.list_artifacts(run_id)}
    assert artifacts == {"advice.md", "advice.html", "advise-1.yaml"}  # no unwrapped recipe.txt
    assert Path(client.download_artifacts(run_id, "advice.md", str(tmp_path))).read_text() == (
        published
    )
    html = Path(client.download_artifacts(run_id, "advice.html", str(tmp_path))).read_text()
    assert "<table>" in html and "<td>LR scaling</td>" in html
    # The version a sweep records for data not built by DVC (its manifest's md5), and the data.
    run = client.get_run(run_id)
    assert run.data.params["data_version"] == manifest_digest(tmp_path / "data", "digits")
    (dataset,) = run.inputs.dataset_inputs
    assert dataset.dataset.name == "digits"


def _dvc_project(project: Path) -> None:
    """A DVC project whose preprocess stage built data/tfrecords/digits (`dvc commit`)."""
    fixtures_model.write_digits(project / "data", train=64, test=16, shards=1)
    run_dvc(project, "init", "--no-scm")
    stage = {"cmd": "true", "outs": ["data/tfrecords/digits"]}
    (project / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"preprocess": stage}}))
    run_dvc(project, "commit", "--force", "preprocess")


@pytest.mark.slow
def test_a_dvc_built_dataset_gets_its_dvc_hash_until_its_data_changes(tmp_path: Path) -> None:
    _dvc_project(tmp_path)
    version = data_version(tmp_path)
    assert version.endswith(".dir")
    assert advice_data_version(tmp_path / "data", "digits") == version
    shard = next((tmp_path / "data" / "tfrecords" / "digits").glob("train*"))
    shard.write_bytes(shard.read_bytes() + b"changed")
    changed = advice_data_version(tmp_path / "data", "digits")
    assert changed == manifest_digest(tmp_path / "data", "digits") != version
