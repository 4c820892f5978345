"""A re-run of an interrupted `towerbench advise` takes up its run where it stopped.

An advise run carries its key (what it probes: the reference run, the advise settings, the
data version and the model file's digest) and, once its probe finished, the probe's result
(`probe.json`). The same advise started again reopens the newest such run that did not finish
(killed, stopped, or left RUNNING by a dead process), reuses its probe, so chooses the same
recipe, rewrites the same `advise-<id>.yaml` and resumes its verification sweep. A run whose
probe never finished is closed as replaced, as before; `fresh` starts anew.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

from mlflow.exceptions import MlflowException
from prefect import get_run_logger

from towerbench.config.advise import AdviseConfig, reference_config
from towerbench.config.losses import parse_loss
from towerbench.config.model_ref import function_provenance, provenance
from towerbench.config.params import Params, TrackingConfig
from towerbench.model.probe import ProbeResult
from towerbench.tasks.advise.advice import advice_data_version, probe_document, start_advice_run
from towerbench.tasks.sweep_lock import config_key
from towerbench.tasks.tracking import (
    REPLACED_BY_TAG,
    client_for,
    ensure_experiment,
    experiment_name,
    newest_unfinished,
    owner_gone,
    reopen_run,
)

ADVISE_KEY_TAG = "towerbench.advise.key"
PROBE_FILE = "probe.json"


@dataclass(frozen=True)
class Interrupted:
    """An advise run that did not finish, and the probe it had finished."""

    run_id: str
    probe: ProbeResult


def advise_key(params: Params, advice: AdviseConfig, data_version: str) -> str:
    """The same reference run, advise settings, data and model and loss files: the same advise
    (a run without a loss file keeps the key it had before loss files)."""
    reference = reference_config(params)
    identity = [
        config_key(reference),
        advice.model_dump(mode="json"),
        data_version,
        provenance(reference.model).get("model_digest", ""),
    ]
    loss_digest = function_provenance(parse_loss(reference.loss), "loss").get("loss_digest")
    if loss_digest is not None:
        identity.append(loss_digest)
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()


def keep_probe(tracking: TrackingConfig, run_id: str, result: ProbeResult) -> None:
    """The probe's result in its advise run, for a re-run to reuse."""
    client_for(tracking).log_dict(run_id, probe_document(result), PROBE_FILE)


def _kept_probe(tracking: TrackingConfig, run_id: str) -> ProbeResult | None:
    with tempfile.TemporaryDirectory() as folder:
        try:
            path = client_for(tracking).download_artifacts(run_id, PROBE_FILE, folder)
            return ProbeResult.from_document(json.loads(Path(path).read_text()))
        except (MlflowException, OSError, ValueError, KeyError, TypeError):
            return None  # the probe never finished (or its record is unreadable)


def interrupted_advice(
    tracking: TrackingConfig, experiment_id: str, key: str
) -> Interrupted | None:
    """The newest run of advise `key` that did not finish and whose process is gone, with its
    finished probe; None when there is none, or its probe never finished."""
    run = newest_unfinished(tracking, experiment_id, ADVISE_KEY_TAG, key)
    if run is None or (run.info.status == "RUNNING" and not owner_gone(run)):
        return None
    probe = _kept_probe(tracking, run.info.run_id)
    return None if probe is None else Interrupted(run.info.run_id, probe)


def resume_advice(tracking: TrackingConfig, interrupted: Interrupted) -> None:
    """`interrupted`'s run RUNNING again, owned by this process, no longer marked replaced."""
    reopen_run(tracking, interrupted.run_id)
    client = client_for(tracking)
    if REPLACED_BY_TAG in client.get_run(interrupted.run_id).data.tags:
        client.delete_tag(interrupted.run_id, REPLACED_BY_TAG)
    get_run_logger().info(
        "resuming advise run %s: its probe (%.0f s) reused",
        interrupted.run_id,
        interrupted.probe.seconds,
    )


def open_advice_run(
    params: Params, advice: AdviseConfig, fresh: bool
) -> tuple[str, ProbeResult | None]:
    """The advise run: the interrupted one of the same advise with its probe (unless `fresh`),
    else a new one and no probe yet."""
    tracking = params.tracking
    version = advice_data_version(Path(params.data.data_dir).resolve(), params.train.dataset)
    key = advise_key(params, advice, version)
    experiment_id = ensure_experiment(tracking, experiment_name(tracking, params.train))
    interrupted = None if fresh else interrupted_advice(tracking, experiment_id, key)
    if interrupted is None:
        tags = {ADVISE_KEY_TAG: key}
        return start_advice_run(params, experiment_id, advice.replicas, tags, version), None
    resume_advice(tracking, interrupted)
    return interrupted.run_id, interrupted.probe
