"""The `sweep` flow: one training process per configuration, tracked in MLflow, then the report.

Read top to bottom: `plan_sweep` (the configurations, their data versions, the resume key),
`open_sweep` (resume the newest unfinished identical sweep, or start its MLflow parent run),
`train_each` (here, one process per configuration, or on a pool's workers) and `finish_sweep`
(the failures artifact and the report). Running the same sweep again resumes: finished
configurations are reused, an interrupted one continues from its checkpoint
(DATA_DIR/checkpoints/<run id>, saved every epoch) in the same MLflow run. `fresh=True` starts anew.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast
from uuid import UUID

from mlflow.entities import Run, RunStatus
from mlflow.exceptions import MlflowException
from prefect import flow, get_run_logger
from prefect.artifacts import (
    create_markdown_artifact,
    create_progress_artifact,
    update_progress_artifact,
)
from prefect.exceptions import TerminationSignal

from towerbench.config.grid import (
    budget_params,
    expand,
    group_name,
    run_name,
    sweep_description,
    swept_fields,
    varied_fields,
)
from towerbench.config.losses import parse_loss
from towerbench.config.model_ref import parse_model
from towerbench.config.params import Params, ReportConfig, SweepGrid, TrackingConfig
from towerbench.config.sections import DataConfig, TrainConfig
from towerbench.config.tracking_uri import PROJECT_DIR, resolve_tracking
from towerbench.core.dataset_lock import datasets_read
from towerbench.core.outcome import ConfigSummary, NothingTrained, Outcome, Status, SweepResult
from towerbench.flows.run_names import sweep_run_name
from towerbench.flows.ui_lines import log_for_the_ui
from towerbench.model.training_data import judged_metric
from towerbench.tasks.data.check import manifest_digest
from towerbench.tasks.report import make_report, read_verdicts
from towerbench.tasks.sweep_lock import (
    only_live_sweep,
    sweep_key,
    sweep_parts,
    what_changed,
)
from towerbench.tasks.tracking import (
    REPLACED_BY_TAG,
    SWEEP_PARTS_TAG,
    TrackingServerLost,
    close_dead_runs,
    config_key,
    create_config_run,
    ensure_experiment,
    experiment_name,
    finish_sweep_run,
    last_sweep,
    log_sweep_inputs,
    owner_gone,
    reopen_run,
    run_outcome,
    run_url,
    set_tags,
    start_sweep_run,
    sweep_charts_url,
    sweep_children,
    tracking_server_watched,
    unfinished_sweep,
)
from towerbench.tasks.training.fork_server import start_fork_server_for
from towerbench.tasks.training.train import checkpoint_dir, train_configuration
from towerbench.tasks.training.worker import WorkerRequest
from towerbench.tasks.user_errors_log import one_line_user_errors

FlowKind = Literal["sweep", "pipeline", "nightly", "advise"]


@dataclass(frozen=True)
class SweepPlan:
    """What a sweep trains: the configurations, the data version of each dataset and the key
    that finds an interrupted identical sweep."""

    configs: list[TrainConfig]
    swept: list[str]  # training fields varied besides the sweep's axes (named in run names)
    versions: dict[str, str]  # dataset -> data version
    key: str
    data_dir: Path
    parts: dict[str, Any]  # the key's parts, to name which one changed
    budget: tuple[str, float | None] = ("epochs", None)  # the sweep's budget and noise scale
    metric: str = "accuracy"  # what every run is judged by (train.metric, resolved)


@dataclass(frozen=True)
class SweepRun:
    """The sweep's MLflow parent run, and its children from an interrupted attempt."""

    tracking: TrackingConfig
    experiment_id: str
    parent_run_id: str
    previous: dict[str, Run]  # config_key -> run


@dataclass(frozen=True)
class Pending:
    """A configuration still to train, and its run from an interrupted attempt, if any."""

    index: int
    name: str
    config: TrainConfig
    earlier: Run | None


def summarize(run_id: str, name: str, config: TrainConfig, outcome: Outcome) -> ConfigSummary:
    """The sweep's line for one configuration."""
    place = {"run_id": run_id, "name": name, "seed": config.seed}
    shape = {"towers": config.towers, "workers": config.workers}
    return ConfigSummary(**outcome.model_dump(), **place, **shape)


def plan_sweep(
    configs: list[TrainConfig],
    train: TrainConfig,
    sweep: SweepGrid,
    data_dir: Path,
    data_version: str | None,
    kind: FlowKind,
) -> SweepPlan:
    """Each dataset's version (`data_version` for the main one when given, else its manifest's
    digest), the resume key of `configs` on those versions, and the one metric they are judged
    by (two are refused before anything trains)."""
    metric = judged_metric(configs, data_dir)
    datasets = dict.fromkeys([train.dataset, *(config.dataset for config in configs)])
    versions = {
        dataset: (data_version if dataset == train.dataset and data_version else None)
        or manifest_digest(data_dir, dataset)
        for dataset in datasets
    }
    key = sweep_key(configs, list(versions.values()), kind)
    parts = sweep_parts(configs, versions)
    budget = (sweep.budget, sweep.noise_scale)
    return SweepPlan(configs, swept_fields(sweep), versions, key, data_dir, parts, budget, metric)


def open_sweep(
    tracking: TrackingConfig,
    plan: SweepPlan,
    train: TrainConfig,
    sweep: SweepGrid,
    kind: FlowKind,
    fresh: bool,
) -> SweepRun:
    """Reopen the newest unfinished sweep with the same key (unless `fresh`), else start one;
    then close the runs dead attempts left RUNNING."""
    experiment_id = ensure_experiment(tracking, experiment_name(tracking, train))
    parent_run_id = None if fresh else unfinished_sweep(tracking, experiment_id, plan.key)
    if parent_run_id is not None:
        reopen_run(tracking, parent_run_id)
        close_dead_runs(tracking, experiment_id, parent_run_id)
        previous = sweep_children(tracking, parent_run_id)
        done = sum(run_outcome(run).status.ended for run in previous.values())
        get_run_logger().info(
            "resuming sweep %s: %d of %d runs done", parent_run_id, done, len(plan.configs)
        )
        return SweepRun(tracking, experiment_id, parent_run_id, previous)
    last = None if fresh else last_sweep(tracking, experiment_id, kind)
    parent_run_id = start_sweep_run(
        tracking,
        experiment_id,
        name=f"{kind} {train.dataset} {time.strftime('%Y-%m-%d %H:%M:%S')}",
        flow=kind,
        params={**sweep_description(train, sweep), "data_version": plan.versions[train.dataset]},
        swept=varied_fields(sweep),
        key=plan.key,
        parts=plan.parts,
    )
    log_sweep_inputs(tracking, parent_run_id, plan.data_dir, plan.versions)
    if last is not None and last.info.status != "FINISHED":
        replace_interrupted(tracking, last, plan, parent_run_id)
    close_dead_runs(tracking, experiment_id, parent_run_id)
    return SweepRun(tracking, experiment_id, parent_run_id, {})


def replace_interrupted(tracking: TrackingConfig, last: Run, plan: SweepPlan, new: str) -> None:
    """Say in one line why the newest sweep of this flow, interrupted, is not resumed (what
    changed) and tag it with the sweep that replaced it (unless its process still runs it)."""
    if last.info.status == "RUNNING" and not owner_gone(last):
        return  # another sweep, live
    parts = last.data.tags.get(SWEEP_PARTS_TAG)
    changed = what_changed(json.loads(parts) if parts else None, plan.parts)
    get_run_logger().warning(
        "new sweep %s, not resuming interrupted sweep %s: %s", new, last.info.run_id, changed
    )
    set_tags(tracking, last.info.run_id, {REPLACED_BY_TAG: new})


def reuse_finished(
    plan: SweepPlan, run: SweepRun
) -> tuple[dict[int, ConfigSummary], list[Pending]]:
    """The configurations an earlier attempt finished (index -> summary), and the rest."""
    finished: dict[int, ConfigSummary] = {}
    pending: list[Pending] = []
    for index, config in enumerate(plan.configs):
        name = run_name(config, plan.swept)
        earlier = run.previous.get(config_key(config))
        if earlier is not None and (outcome := run_outcome(earlier)).status.ended:
            finished[index] = summarize(earlier.info.run_id, name, config, outcome)
            get_run_logger().info("%s: done in an earlier attempt, reused", name)
        else:
            pending.append(Pending(index, name, config, earlier))
    return finished, pending


def open_config_run(plan: SweepPlan, run: SweepRun, job: Pending) -> WorkerRequest:
    """The configuration's MLflow run (its interrupted one, or a new child) and the request that
    trains it; opened just before it trains, so a stopped sweep leaves no run RUNNING that never
    started."""
    version = plan.versions[job.config.dataset]
    if job.earlier is not None:
        run_id = job.earlier.info.run_id
        reopen_run(run.tracking, run_id, Status.RUNNING)
    else:
        group = group_name(job.config, plan.swept)
        run_id = create_config_run(
            run.tracking,
            run.experiment_id,
            run.parent_run_id,
            job.config,
            job.name,
            group,
            version,
            extra=budget_params(job.config, *plan.budget) | {"effective.metric": plan.metric},
        )
    return WorkerRequest(
        config=job.config,
        data_dir=plan.data_dir,
        tracking_uri=run.tracking.tracking_uri or "",
        run_id=run_id,
        data_version=version,
        checkpoint_dir=checkpoint_dir(plan.data_dir, run_id),
    )


def train_here(plan: SweepPlan, run: SweepRun, job: Pending, progress: UUID) -> ConfigSummary:
    """One configuration in a process of this machine."""
    total = len(plan.configs)
    span = (100 * job.index / total, 100 * (job.index + 1) / total)
    request = open_config_run(plan, run, job)
    state = train_configuration(request, job.name, run.tracking, progress, span, return_state=True)
    if state.is_failed():
        error = state.result(raise_on_failure=False)
        if isinstance(error, TrackingServerLost):  # every later run would fail the same way
            raise error
        outcome = Outcome.failed(str(error))
    else:
        outcome = state.result()
        if request.checkpoint_dir is not None:  # the model is in MLflow
            shutil.rmtree(request.checkpoint_dir, ignore_errors=True)
    return summarize(request.run_id, job.name, job.config, outcome)


def on_workers(path: Path) -> Path:
    """A path (the data folder, a model file) as workers find it: relative to the project (the
    folder the sweep runs in, else towerbench's checkout) when it lies inside it, so each worker
    takes it in its own `--project`; else as is (a shared mount)."""
    for project in (Path.cwd(), PROJECT_DIR):
        if path.is_relative_to(project):
            return path.relative_to(project)
    return path


def for_workers(request: WorkerRequest, data_dir: Path) -> WorkerRequest:
    """The request as a pool's workers take it: the data folder and the model and loss files
    relative to the project, found in each worker's checkout, with the files' digests to check."""
    config = request.config
    model, loss = parse_model(config.model), parse_loss(config.loss)
    if model.path is not None:
        config = config.model_copy(update={"model": f"{on_workers(model.path)}:{model.function}"})
    if loss is not None and loss.path is not None:
        config = config.model_copy(update={"loss": f"{on_workers(loss.path)}:{loss.function}"})
    update = {
        "data_dir": on_workers(data_dir),
        "checkpoint_dir": None,
        "config": config,
        "model_digest": model.digest(),
        "loss_digest": None if loss is None else loss.digest(),
    }
    return request.model_copy(update=update)


def train_on_pool(
    pool: str, plan: SweepPlan, run: SweepRun, pending: list[Pending], progress: UUID
) -> dict[int, ConfigSummary]:
    """The configurations as flow runs of `pool`'s workers; index -> summary."""
    from towerbench.flows.fan_out import Job, check_served, run_on_pool

    check_served(pool)  # before any run is opened
    if not (run.tracking.tracking_uri or "").startswith(("http://", "https://")):
        get_run_logger().warning(
            "tracking URI %s is not a server: only workers on this host can log to it",
            run.tracking.tracking_uri,
        )
    jobs = [
        Job(job.index, for_workers(open_config_run(plan, run, job), plan.data_dir), job.name)
        for job in pending
    ]
    summaries: dict[int, ConfigSummary] = {}

    def on_done(job: Job, outcome: Outcome) -> None:
        summaries[job.index] = summarize(job.request.run_id, job.name, job.request.config, outcome)
        update_progress_artifact(progress, 100 * len(summaries) / len(jobs))

    run_on_pool(pool, jobs, run.tracking, on_done)
    return summaries


def train_each(plan: SweepPlan, run: SweepRun, pool: str | None) -> list[ConfigSummary]:
    """Every configuration: reused from an earlier attempt, or trained here or on `pool`."""
    summaries, pending = reuse_finished(plan, run)
    # Prefect's dispatcher returns a coroutine only to async callers; this one is synchronous.
    progress = cast(
        UUID,
        create_progress_artifact(
            0.0, key="sweep-progress", description=f"Training {len(plan.configs)} runs"
        ),
    )
    if pool is None:
        summaries |= {job.index: train_here(plan, run, job, progress) for job in pending}
    else:
        summaries |= train_on_pool(pool, plan, run, pending, progress)
    return [summaries[index] for index in sorted(summaries)]


def note_unfinished(summaries: list[ConfigSummary]) -> None:
    """A "k of n configurations failed / diverged" artifact, each run named with why."""
    lines = []
    for status, why in ((Status.FAILED, "see its log"), (Status.DIVERGED, "see its loss curve")):
        runs = [summary for summary in summaries if summary.status == status]
        if runs:
            lines += [f"**{len(runs)} of {len(summaries)} configurations {status}.**", ""]
            lines += [f"- `{summary.name}`: {summary.error or why}" for summary in runs]
            lines.append("")
    if lines:
        create_markdown_artifact(
            "\n".join(lines),
            key="sweep-failures",
            description="Configurations that failed or diverged",
        )


def finish_sweep(summaries: list[ConfigSummary], run: SweepRun, report: ReportConfig) -> str:
    """Fail when every configuration failed (nothing to report); else note the failed and
    diverged ones and write the report."""
    failed = [summary for summary in summaries if summary.status == Status.FAILED]
    if len(failed) == len(summaries):
        raise NothingTrained(
            f"all {len(summaries)} configurations failed; the first: "
            f"{failed[0].error or 'see its log'}"
        )
    note_unfinished(summaries)
    return make_report(run.tracking, run.parent_run_id, report)


def run_sweep(
    plan: SweepPlan,
    tracking: TrackingConfig,
    train: TrainConfig,
    sweep: SweepGrid,
    report: ReportConfig,
    kind: FlowKind,
    fresh: bool,
) -> SweepResult:
    """Open the sweep, train each configuration, finish; the parent run ends FINISHED (some
    configuration completed), FAILED or KILLED however this ends."""
    with tracking_server_watched(tracking):
        run = open_sweep(tracking, plan, train, sweep, kind, fresh)
    mlflow_url = run_url(tracking, run.experiment_id, run.parent_run_id)
    charts_url = sweep_charts_url(tracking, run.experiment_id, run.parent_run_id)
    get_run_logger().info(
        "%d runs; MLflow parent run %s; its runs' charts %s",
        len(plan.configs),
        mlflow_url,
        charts_url,
    )
    status = RunStatus.FAILED
    try:
        with tracking_server_watched(tracking):
            summaries = train_each(plan, run, sweep.pool)
            report_path = finish_sweep(summaries, run, report)
        if any(summary.status == Status.COMPLETED for summary in summaries):
            status = RunStatus.FINISHED
    except (KeyboardInterrupt, SystemExit, TerminationSignal):  # Prefect's own SIGTERM signal
        status = RunStatus.KILLED
        raise
    finally:
        with contextlib.suppress(MlflowException):  # the server may be what went away
            finish_sweep_run(tracking, run.parent_run_id, RunStatus.to_string(status))
    result = SweepResult(
        parent_run_id=run.parent_run_id,
        mlflow_url=mlflow_url,
        configs=summaries,
        verdicts=read_verdicts(Path(report_path)),
        report=report_path,
    )
    log_for_the_ui(result.summary_lines())
    return result


@flow(name="sweep", flow_run_name=sweep_run_name)
def sweep(
    train: TrainConfig = TrainConfig(),  # noqa: B008 - immutable default shown in the UI form
    sweep: SweepGrid = SweepGrid(),  # noqa: B008
    tracking: TrackingConfig = TrackingConfig(),  # noqa: B008
    report: ReportConfig = ReportConfig(),  # noqa: B008
    data: DataConfig = DataConfig(),  # noqa: B008
    data_version: str | None = None,
    kind: FlowKind = "sweep",
    fresh: bool = False,
) -> SweepResult:
    """Train `train` with every combination of the `sweep` lists (each run in its own process),
    then compare them.

    A configuration that fails or diverges is recorded as such and the sweep goes on; the sweep
    fails (its report written when a run diverged) when no configuration completed, and
    otherwise completes with a "k of n failed / diverged" artifact.
    """
    one_line_user_errors()
    tracking = resolve_tracking(tracking)
    configs = expand(train, sweep)
    start_fork_server_for(configs, sweep.pool)  # imports beside the set-up (unless started)
    plan = plan_sweep(configs, train, sweep, Path(data.data_dir).resolve(), data_version, kind)
    with only_live_sweep(plan.data_dir, plan.key), datasets_read(plan.data_dir, plan.versions):
        result = run_sweep(plan, tracking, train, sweep, report, kind, fresh)
    failure = result.nothing_trained()
    if failure is not None:
        raise NothingTrained(failure, result)
    return result


def sweep_params(params: Params, **options: Any) -> SweepResult:
    """The sweep that `params` describes (its train, sweep, tracking, report and data sections);
    `options` are the flow's other parameters (data_version, kind, fresh)."""
    return sweep(
        train=params.train,
        sweep=params.sweep,
        tracking=params.tracking,
        report=params.report,
        data=params.data,
        **options,
    )
