"""AdaScale and the noise scale from the training process to the report, for real: 1 tower and 2
towers under adascale train in their own processes and log to MLflow in SQLite; the report
reads them back."""

from __future__ import annotations

from pathlib import Path

import fixtures_model
import pytest
from mlflow.tracking import MlflowClient

from towerbench.config.params import ReportConfig, TrackingConfig
from towerbench.config.sections import TrainConfig
from towerbench.config.tracking_uri import resolve_tracking
from towerbench.model.noise_advice import advising_noise_scale
from towerbench.tasks.report import write_report
from towerbench.tasks.report.reading import run_record
from towerbench.tasks.report.statistics import ADASCALE_METRICS
from towerbench.tasks.tracking import create_config_run, ensure_experiment, start_sweep_run
from towerbench.tasks.training.train import run_training_process
from towerbench.tasks.training.worker import WorkerRequest

pytestmark = pytest.mark.slow  # trains, in processes of its own

BASE_LR = 0.05


def test_adascale_and_the_noise_scale_are_logged_per_epoch_and_reported(tmp_path: Path) -> None:
    data_dir = fixtures_model.write_digits(tmp_path / "data", train=192, test=40, shards=1)
    tracking = resolve_tracking(TrackingConfig(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}"))
    experiment_id = ensure_experiment(tracking, "adascale")
    parent = start_sweep_run(
        tracking, experiment_id, "adascale", "sweep", {}, [], key="k", parts={}
    )
    # Budget: 3 reference epochs of 192 / 16 = 12 steps; 2 towers of 16 make 18 to 36 steps.
    common = dict(dataset="digits", reference_batch=16, epochs=3, base_lr=BASE_LR)
    configs = {
        "1 tower": TrainConfig(**common, towers=1, global_batch=16),
        "adascale": TrainConfig(**common, towers=2, global_batch=32, lr_scaling="adascale"),
    }
    run_ids = {}
    for name, config in configs.items():
        run_ids[name] = create_config_run(tracking, experiment_id, parent, config, name, name, "v1")
        request = WorkerRequest(
            config=config,
            data_dir=data_dir,
            tracking_uri=tracking.tracking_uri,
            run_id=run_ids[name],
            data_version="v1",
        )
        outcome = run_training_process(request, on_event=lambda event: None)
        assert outcome.status == "completed", outcome

    client = MlflowClient(tracking.tracking_uri)
    run_id = run_ids["adascale"]
    epochs = [point.step for point in client.get_metric_history(run_id, "epoch")]
    assert len(epochs) >= 3
    for key in (*ADASCALE_METRICS, "noise_scale"):
        # One point per epoch (the final metrics repeat noise_scale at the last epoch's step).
        steps = [point.step for point in client.get_metric_history(run_id, key)]
        assert sorted(set(steps)) == epochs, key
    taus = [point.value for point in client.get_metric_history(run_id, "adascale_tau")]
    assert taus == sorted(taus) and taus[-1] >= 36
    run = client.get_run(run_id)
    mean_gain = taus[-1] / run.data.metrics["steps"]
    assert 1.0 <= mean_gain <= 2.0
    assert float(run.data.params["effective_lr"]) == pytest.approx(BASE_LR * mean_gain)

    # The report's noise scale is the harmonic mean of the per-epoch values, not the final one.
    record = run_record(client, run)
    per_epoch = {
        point.step: point.value for point in client.get_metric_history(run_id, "noise_scale")
    }
    assert record.noise_scale == pytest.approx(advising_noise_scale(per_epoch.values()))
    assert record.final_noise_scale == run.data.metrics["noise_scale"]
    assert record.noise_curves["adascale_tau"][1][-1] == taus[-1]

    report = write_report(tracking, parent, ReportConfig(report_dir=tmp_path / "reports"))
    text = report.read_text()
    assert "## Gradient noise" in text and "![noise_scale_vs_epoch.png]" in text
    assert (report.parent / "noise_scale_vs_epoch.png").stat().st_size > 0
    adascale_row = next(
        line for line in text.splitlines() if line.startswith("| adascale | ") and " · " in line
    )
    assert f" / {run.data.metrics['steps']:.0f} |" in adascale_row  # tau / updates
    assert f"| {mean_gain:.2f} · " in adascale_row

    # The configurations table: the epochs and updates it trained, not the 3 configured.
    trained, steps = run.data.metrics["epochs"], run.data.metrics["steps"]
    assert trained == pytest.approx(steps / 6)  # 192 examples at batch 32
    budget = " (budget 3)" if abs(trained / 3 - 1) > 0.02 else ""
    setup_row = next(line for line in text.splitlines() if line.startswith("| adascale | 32 | "))
    assert setup_row.endswith(f"| {trained:.3g}{budget} | {steps:.0f} | 1/1 |"), setup_row
    one = client.get_run(run_ids["1 tower"]).data.metrics
    assert one["epochs"] == 3 and f"| 1 tower | 16 | 0.05 | 3 | {one['steps']:.0f} | 1/1 |" in text
    seen = f"{trained / 3:.2f}× the training examples of `1 tower` ({trained:.3g} epochs trained"
    verdict = next(line for line in text.splitlines() if line.startswith("- **adascale**: "))
    assert (f"; it saw {seen}" in verdict) == (trained / 3 > 1.05)
