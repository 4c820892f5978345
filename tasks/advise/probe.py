"""The probe of `towerbench advise` in a process of its own, and what the recipe reads from it.

The probe (model/probe.py) trains, so it runs in a process forked from the training processes'
fork server (tasks/training/fork_server.py: TensorFlow already imported), never in the flow's
process: TensorFlow fixes its devices once per process, and the sweep that may follow trains
elsewhere.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from towerbench.config.optimizers import HYPERPARAMETERS, family
from towerbench.config.sections import TrainConfig
from towerbench.core.errors import TowerbenchError
from towerbench.model.noise_advice import advising_noise_scale
from towerbench.model.probe import ProbeResult, probe
from towerbench.tasks.advise.recipe import Measurements
from towerbench.tasks.training.fork_server import call_forked


@dataclass(frozen=True)
class ProbeRequest:
    """Probe `reference` (1 tower, batch P) and the LRs of `replicas` x P."""

    reference: TrainConfig
    data_dir: Path
    replicas: int
    steps: int

    @property
    def global_batch(self) -> int:
        return self.reference.global_batch * self.replicas

    def learning_rates(self) -> list[float]:
        """The LRs a recipe can ask for at the K-tower batch, increasing: the base LR, sqrt's
        and, for the SGD family, linear's (AdaScale's gain lies between 1 and linear's; an
        adaptive optimizer's, to the power 1/2, between 1 and sqrt's)."""
        scale = self.global_batch / self.reference.reference_batch
        base = self.reference.base_lr
        rules = {base, base * math.sqrt(scale)}
        if family(self.reference.optimizer) == "sgd":
            rules.add(base * scale)
        return sorted(rules)


def run_probe(request: ProbeRequest) -> ProbeResult:
    """The probe, in a process forked from the training processes' fork server (it ends with
    this process however this one ends); its TowerbenchError is raised here."""
    try:
        return call_forked(
            "towerbench-probe",
            probe,
            request.reference,
            request.data_dir,
            request.replicas,
            request.learning_rates(),
            request.steps,
        )
    except ChildProcessError as error:
        raise TowerbenchError(
            f"the probe's process died ({error}: killed, or out of memory: the probe runs the "
            f"global batch of {request.global_batch} on this host's tower devices)"
        ) from None


@task(name="probe", cache_policy=NO_CACHE)
def probe_task(request: ProbeRequest) -> ProbeResult:
    """The probe, each measurement logged."""
    logger = get_run_logger()
    result = run_probe(request)
    noise = result.noise
    logger.info(
        "noise scale %s after %d steps at batch %d (loss %.2f -> %.2f)",
        f"{noise.noise_scale:.0f}" if noise.noise_scale is not None else "-",
        noise.steps,
        noise.batch,
        noise.first_loss,
        noise.last_loss,
    )
    for trial in result.trials:
        logger.info(
            "LR %.3g at batch %d: %s after %d steps",
            trial.learning_rate,
            request.global_batch,
            trial.diverged or f"stable, loss {trial.last_loss:.2f}",
            trial.steps,
        )
    return result


# The noise scale is used once its last two values along the probe agree within this factor.
SETTLED_RATIO = 2.0


def settled_noise_scale(result: ProbeResult) -> tuple[float | None, str]:
    """The noise scale the recipe uses, and which value it is and why: the harmonic mean of its
    values along the probe, the rule the report's verdicts apply to a run's epochs
    (model/noise_advice.py). None when the estimate had not settled (the last two values along
    the probe not both positive and within a factor SETTLED_RATIO): too short a probe, or a loss
    that barely moved."""
    noise = result.noise
    values = [value for _, value in noise.along]
    along = " -> ".join(f"{value:.0f}" for value in values)
    last = values[-2:]
    settled = len(last) == 2 and min(last) > 0 and max(last) <= SETTLED_RATIO * min(last)
    advising = advising_noise_scale(values) if settled else None
    if advising is None:
        return None, (
            f"not settled after {noise.steps} steps at batch {noise.batch} (along the probe: "
            f"{along or 'none'}; loss {noise.first_loss:.2f} -> {noise.last_loss:.2f}): not used"
        )
    return advising, (
        f"harmonic mean of its values along {noise.steps} probe steps at 1 tower, batch "
        f"{noise.batch} ({along}; loss {noise.first_loss:.2f} -> {noise.last_loss:.2f}), the "
        "rule the report's verdicts use"
    )


def probe_lines(request: ProbeRequest, result: ProbeResult, measured: Measurements) -> list[str]:
    """What the probe measured, and which noise-scale value the recipe uses and why."""
    noise = (
        f"noise scale {measured.noise_scale:.0f} ({measured.noise_scale_source}): it grows as "
        "the loss falls, so the start's values understate later gains, and a recipe from them "
        "errs towards a smaller LR and more updates"
        if measured.noise_scale is not None
        else f"noise scale {measured.noise_scale_source}"
    )
    tried = ", ".join(f"{trial.learning_rate:.3g}" for trial in result.trials)
    stable = (
        f"largest stable LR at batch {request.global_batch}: {result.largest_stable_lr:.3g} "
        f"(tried {tried}" + (f"; {result.instability})" if result.instability else ")")
    )
    batchnorm = "BatchNorm" if result.has_batchnorm else "no BatchNorm"
    where = f"{len(result.tower_devices)} tower devices"
    return [f"probe ({result.seconds:.0f} s, {where}): {batchnorm}; {noise}", stable]


def measurements(request: ProbeRequest, result: ProbeResult) -> Measurements:
    """What choose_recipe reads: the probe's numbers and the reference run to scale."""
    reference = request.reference
    noise_scale, source = settled_noise_scale(result)
    trial = result.batch_norm_trial  # the largest stable LR trial, with BatchNorm's lag
    return Measurements(
        towers=request.replicas,
        per_tower_batch=reference.global_batch,
        reference_batch=reference.reference_batch,
        base_lr=reference.base_lr,
        epochs=reference.epochs,
        has_batchnorm=result.has_batchnorm,
        noise_scale=noise_scale,
        noise_scale_source=source,
        largest_stable_lr=result.largest_stable_lr,
        instability=result.instability,
        decay=reference.decay,
        decay_epochs=reference.decay_epochs,
        decay_factor=reference.decay_factor,
        decay_boundaries=tuple(reference.decay_boundaries),
        optimizer=reference.optimizer,
        optimizer_values=tuple(
            (name, getattr(reference, name))
            for name in sorted(HYPERPARAMETERS[reference.optimizer])
        ),
        weight_decay=reference.weight_decay,
        train_examples=result.train_examples,
        step_seconds=result.step_seconds,
        device_kind=result.device_kind,
        accuracy_moving_bn=trial.accuracy_moving_bn if trial else None,
        accuracy_recomputed_bn=trial.accuracy_recomputed_bn if trial else None,
        batch_norm_steps=trial.steps if trial else None,
    )
