"""The `pipeline` flow: fetch -> preprocess through DVC -> sweep -> report."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

from prefect import flow

from towerbench.config.load import load
from towerbench.config.optimizers import OptimizerName
from towerbench.config.params import Params
from towerbench.config.run_form import (
    DatasetChoice,
    SweepChoice,
    form_overrides,
    loss_override,
    model_override,
    optimizer_override,
)
from towerbench.config.sections import TrainConfig, dataset_name, one_value
from towerbench.core.errors import TowerbenchError
from towerbench.core.outcome import SweepResult
from towerbench.flows.run_names import dated_run_name
from towerbench.flows.sweep import FlowKind, sweep_params
from towerbench.flows.ui_lines import log_for_the_ui
from towerbench.tasks.data.dvc_stages import check_dvc_project
from towerbench.tasks.data.fetch import fetch_task
from towerbench.tasks.data.preprocess import preprocess_task
from towerbench.tasks.report import publish_artifact
from towerbench.tasks.user_errors_log import one_line_user_errors

# The form's epochs field refuses what train.epochs refuses (its JSON schema carries the bound).
Epochs = one_value(TrainConfig, "epochs")


def check_trains_on_fetched_data(params: Params) -> None:
    """The sweep must train on the dataset this pipeline builds, or its data version lies."""
    fetched = dataset_name(params.fetch)
    if params.train.dataset != fetched:
        raise TowerbenchError(
            f"train.dataset: {params.train.dataset!r} is not the dataset that fetch "
            f"builds ({fetched!r}); set train.dataset to {fetched!r} or change fetch"
        )


def run_pipeline(
    params: Params, project_dir: Path, kind: FlowKind, fresh: bool = False
) -> SweepResult:
    """Bring the data up to date through DVC in the project `project_dir` (the folder of the
    params file), then sweep with its hash as the data version."""
    check_trains_on_fetched_data(params)
    check_dvc_project(project_dir)
    stages = fetch_task(project_dir, params.fetch, params.preprocess, params.data.data_dir)
    data_version = preprocess_task(stages)
    outcome = sweep_params(params, data_version=data_version, kind=kind, fresh=fresh)
    # The top-level run shows the report too, with where to find it, and ends with its summary.
    lead = f"MLflow parent run: {outcome.mlflow_url}\n\n"
    publish_artifact(Path(outcome.report), key=f"{kind}-report", lead=lead)
    log_for_the_ui(outcome.summary_lines())
    return outcome


@flow(name="pipeline", flow_run_name=partial(dated_run_name, "pipeline"))
def pipeline(
    dataset: DatasetChoice = DatasetChoice(),  # type: ignore[valid-type]  # noqa: B008
    sweep: SweepChoice = SweepChoice(),  # type: ignore[valid-type]  # noqa: B008
    epochs: Epochs = TrainConfig.model_fields["epochs"].default,  # type: ignore[valid-type]
    model: str | None = None,
    loss: str | None = None,
    optimizer: OptimizerName | None = None,
    advanced: dict[str, Any] | None = None,
    params_file: str = "params.yaml",
    fresh: bool = False,
) -> SweepResult:
    """Fetch and preprocess the dataset (DVC), train every configuration, write the report.

    Args:
        dataset: The dataset to fetch, preprocess and train on. One that params.yaml does not
            describe is built by DVC in datasets/NAME/ beside it; params.yaml is not edited.
        sweep: The lists to compare; one run per combination and seed.
        epochs: Epochs of the reference batch (see sweep.budget).
        model: The network; empty: the params file's. A built-in name (tutorial, tutorial_bn,
            resnet20) or your own, path/to/file.py:function (relative to the params file's
            folder) or package.module:function.
        loss: The per-example loss; empty: the params file's. A built-in name
            (sparse_categorical_crossentropy, categorical_crossentropy, ...) or your own,
            path/to/file.py:function (relative to the params file's folder).
        optimizer: The optimizer; empty: the params file's. Another one leaves out the file's
            base_lr tuned for its own (and the hyperparameters it does not read).
        advanced: Any other setting, keyed as in params.yaml, e.g. {"train.base_lr": 0.05}.
        params_file: The params.yaml every other setting comes from.
        fresh: Start anew even if an identical sweep was interrupted (default: resume it).
    """
    one_line_user_errors()
    path = Path(params_file)
    in_file = load(path, resolve_tracking=False)
    overrides = model_override(model, path) + loss_override(loss, path)
    overrides += optimizer_override(optimizer)
    overrides += form_overrides(dataset, sweep, epochs, advanced or {}, in_file.fetch)
    return run_pipeline(load(path, overrides), path.resolve().parent, "pipeline", fresh)
