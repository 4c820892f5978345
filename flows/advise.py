"""The `advise` flow: probe the 1-tower run, choose the K-tower recipe, keep it, check it.

Read top to bottom: `probe_and_choose` (the probe in a process of its own, then
tasks/advise/recipe.py's rules on what it measured), `keep_recipe` (advise-<id>.yaml and the
advise run in MLflow) and `verify_recipe` (the sweep's own steps on 1 tower and the recipe's K
towers for S seeds: MLflow, resume, pools, the report; then one verdict).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from mlflow.entities import RunStatus
from prefect import flow

from towerbench.config.advise import (
    AdviseConfig,
    check_verifiable,
    reference_config,
    verification_configs,
    verification_grid,
)
from towerbench.config.load import load, override_at
from towerbench.config.optimizers import OptimizerName
from towerbench.config.params import Params, SweepGrid
from towerbench.config.run_form import loss_override, model_override, optimizer_override
from towerbench.config.sections import TrainConfig
from towerbench.core.dataset_lock import datasets_read
from towerbench.core.outcome import NothingTrained
from towerbench.flows.run_names import advise_run_name
from towerbench.flows.sweep import plan_sweep, run_sweep
from towerbench.flows.ui_lines import log_for_the_ui
from towerbench.model.probe import ProbeResult
from towerbench.tasks.advise.advice import (
    Advice,
    advice_data_version,
    finish_advice_run,
    log_advice,
    probe_document,
    recipe_document,
    recipe_params,
    write_params_file,
)
from towerbench.tasks.advise.probe import ProbeRequest, measurements, probe_lines, probe_task
from towerbench.tasks.advise.recipe import Measurements, Recipe, choose_recipe
from towerbench.tasks.advise.resume import keep_probe, open_advice_run
from towerbench.tasks.advise.verdict import (
    Verification,
    verification_records,
    verify_outcome,
)
from towerbench.tasks.sweep_lock import only_live_sweep
from towerbench.tasks.tracking import claim_run
from towerbench.tasks.training.fork_server import start_fork_server_for
from towerbench.tasks.user_errors_log import one_line_user_errors


def probe_and_choose(
    params: Params, advice: AdviseConfig, probed: ProbeResult | None = None
) -> tuple[ProbeRequest, ProbeResult, Measurements, Recipe, list[str]]:
    """The probe's measurements (`probed`: an interrupted attempt's probe, reused), the recipe
    chosen from them, and the lines that say both."""
    request = ProbeRequest(
        reference_config(params), params.data.data_dir, advice.replicas, advice.probe_steps
    )
    result = probed if probed is not None else probe_task(request)
    measured = measurements(request, result)
    recipe = choose_recipe(measured)
    lines = [
        *probe_lines(request, result, measured),
        *recipe.lines(),
    ]
    log_for_the_ui(lines)
    return request, result, measured, recipe, lines


def recipe_runs(
    params: Params, advice: AdviseConfig, recipe: Recipe
) -> tuple[TrainConfig, SweepGrid]:
    """The 1-tower run with the recipe's LR policy, and the sweep that verifies it."""
    rule, warmup = str(recipe.lr_scaling.value), float(recipe.warmup_epochs.value)
    values = reference_config(params).model_dump(exclude_unset=True)
    values.update(lr_scaling=rule, warmup_epochs=warmup, **recipe.sections()["train"])
    return TrainConfig.model_validate(values), verification_grid(
        advice, params, rule, warmup, recipe.sweep_budget, recipe.noise_scale
    )


def verify_recipe(
    params: Params, train: TrainConfig, grid: SweepGrid, recipe: Recipe, fresh: bool
) -> Verification:
    """1 tower against the recipe's towers through the sweep's steps, then the verdict."""
    configs = verification_configs(train, grid)
    start_fork_server_for(configs, grid.pool)
    data_dir = Path(params.data.data_dir).resolve()
    version = advice_data_version(data_dir, train.dataset)  # the advise run's, as sweeps record it
    plan = plan_sweep(configs, train, grid, data_dir, version, "advise")
    with only_live_sweep(plan.data_dir, plan.key), datasets_read(plan.data_dir, plan.versions):
        result = run_sweep(plan, params.tracking, train, grid, params.report, "advise", fresh)
    records = verification_records(params.tracking, result)
    verification = verify_outcome(result, recipe, records, params.report.margin)
    log_for_the_ui([verification.verdict])
    return verification


def advise_params(params: Params, advice: AdviseConfig, fresh: bool = False) -> Advice:
    """Probe, choose, keep and (when `advice.verify`) verify the recipe for `params`."""
    check_verifiable(advice, params)
    run_id, probed = open_advice_run(params, advice, fresh)
    claim_run(params.tracking, run_id)  # and close the runs of killed attempts
    status, verification = RunStatus.FAILED, None
    try:
        _, result, measured, recipe, lines = probe_and_choose(params, advice, probed)
        if probed is None:
            keep_probe(params.tracking, run_id, result)
        train, grid = recipe_runs(params, advice, recipe)
        sections = recipe_params(params, train, grid)
        path = write_params_file(params.report.report_dir, run_id, sections, lines)
        log_advice(params, run_id, measured, recipe, path, lines, advice.verify)
        if advice.verify:
            verification = verify_recipe(params, train, grid, recipe, fresh)
        if verification is None or verification.outcome != "diverged":
            status = RunStatus.FINISHED
    except (KeyboardInterrupt, SystemExit):
        status = RunStatus.KILLED
        raise
    finally:
        finish_advice_run(params, run_id, verification, RunStatus.to_string(status))
    advised = Advice(
        advise_run_id=run_id,
        params_file=str(path),
        probe=probe_document(result),
        measurements=dataclasses.asdict(measured),
        recipe=recipe_document(recipe),
        lines=lines,
        verification=verification,
    )
    if verification is not None and verification.outcome == "diverged":
        raise NothingTrained(verification.verdict, advised)  # it gives the probe's advice
    return advised


@flow(name="advise", flow_run_name=advise_run_name)
def advise(
    advice: AdviseConfig,
    model: str | None = None,
    loss: str | None = None,
    optimizer: OptimizerName | None = None,
    dataset: str | None = None,
    params_file: str | None = "params.yaml",
    advanced: dict[str, Any] | None = None,
    fresh: bool = False,
) -> Advice:
    """Find the learning-rate recipe for K towers from a short 1-tower probe, and check it.

    Args:
        advice: The towers (per worker) and workers to advise for, the verification's seeds,
            whether to verify, and the probe's length.
        model: The network; empty: the params file's. A built-in name (tutorial, tutorial_bn,
            resnet20) or your own, path/to/file.py:function (relative to the params file's
            folder) or package.module:function.
        loss: The per-example loss; empty: the params file's. A built-in name
            (sparse_categorical_crossentropy, categorical_crossentropy, ...) or your own,
            path/to/file.py:function (relative to the params file's folder).
        optimizer: The optimizer; empty: the params file's. Another one leaves out the file's
            base_lr tuned for its own (and the hyperparameters it does not read).
        dataset: The preprocessed dataset; default: the params file's.
        params_file: The params.yaml every other setting comes from (none: the defaults).
        advanced: Any other setting, keyed as in params.yaml, e.g. {"train.base_lr": 0.05}.
        fresh: Probe and verify anew even if an identical advise was interrupted (default:
            reuse its finished probe and recipe file, resume its verification).
    """
    one_line_user_errors()
    path = Path(params_file) if params_file else None
    overrides = model_override(model, path) + loss_override(loss, path)
    overrides += optimizer_override(optimizer)
    if dataset is not None:
        overrides.append(override_at("train.dataset", dataset, "dataset"))
    overrides += [override_at(key, value, key) for key, value in (advanced or {}).items()]
    return advise_params(load(path, overrides), advice, fresh)
