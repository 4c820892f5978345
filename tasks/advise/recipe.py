"""Choose a large-batch recipe from what a short probe measured: the LR scaling rule, warmup,
budget and schedule, each with a one-line reason quoting the number that decided it.

The rules, and what they rest on:

- **The gain the batch can use.** The best LR at batch B is about eps_max / (1 + B_noise / B)
  (McCandlish et al. 2018, eq. 2.6), so going from the reference batch b0 to B = k b0 multiplies
  it by r = (1 + B_noise/b0) / (1 + B_noise/B): about k (linear) well below the noise scale,
  about 1 far above it. This is AdaScale's gain at that noise scale (model/adascale.py).
- **Scaling rule.** A fixed rule whose factor (linear k, sqrt sqrt(k)) is within 25% of r, the
  nearest; otherwise `adascale`, which applies the gain it measures at every step (Johnson et al.
  2020). A rule whose LR is above the largest stable LR the probe found at batch B is left out:
  here the LRN tutorial network diverged at the linear LR 0.4 at batch 512 (cure-updates, 1 of 2
  seeds), and You et al. 2017 found LRN networks do not follow the linear rule. Without a noise
  scale: linear (Goyal et al. 2017) if the network has BatchNorm, else sqrt, if stable.
  Measured here: the LRN network's noise scale 163-434 gives r 1.7-2.4, nearest sqrt, and sqrt
  was its best rule (cure-updates, +7.1 pp); tutorial_bn's 9228 gives r 3.8, linear, which came
  within 0.4 pp of 1 tower (cure-bn).
- **Budget.** Reaching the same loss takes S_min (1 + B_noise/B) steps (McCandlish et al.), so
  B needs 1/r of the reference's steps, k/r = (1 + B/B_noise) / (1 + b0/B_noise) of its epochs:
  the cheapest budget the measurement supports, `sweep.budget: noise` (between equal epochs and
  equal updates). Without a noise scale, equal updates (Hoffer et al. 2017), k >= k/r times the
  epochs, cannot fall short. Measured here: k/r 1.04 (cure-bn) kept the gap within 0.4 pp at
  equal epochs; k/r 1.7-2.3 (LRN) lost 5.7-9.8 pp at equal epochs and gained 7.1 pp at equal
  updates (4x the epochs). `adascale` has its own budget: it ends when its progress tau reaches
  the reference's number of updates.
- **Cost.** The predicted optimizer steps of the K-tower run under that budget, and its wall
  time: those steps x the probe's measured time per K-tower step (training steps only, no
  evaluation); a prediction for K real devices only when the probe ran on them.
- **Warmup.** A scaled-up LR is reached by warmup (Goyal et al.: 5 of 90 epochs) over a sixth of
  the epochs, at least 1 and at most 5 (cure-bn: 2 of 12). AdaScale needs none.
- **Schedule.** An LR that still stands near its peak at the end is annealed linearly to 0: with
  it 4 towers came within 0.4 pp (cure-bn), and on digits a constant LR left the last epoch's
  accuracy to float rounding (the digits preset in config/sections.py).

- **Optimizer family.** Adaptive optimizers (adam, adamw, rmsprop, lamb) take the rules that fit
  them: the square-root rule of Malladi et al. 2022 (LR x sqrt(k), 1 - beta x k, epsilon /
  sqrt(k)) and AdaScale's gain to the power 1/2 (AdamScale), compared with the predicted gain to
  the same power; the linear rule is not theirs. When no rule is stable at the K-tower batch, the
  recipe names the layer-wise optimizer of the family: LARS for SGD (You et al. 2017 trained
  batches the linear rule diverged at), LAMB for Adam (You et al. 2019).

Which noise scale: the harmonic mean of its values along the probe (model/noise_advice.py, the
report's rule). It grows as the loss falls (McCandlish et al.), so the probe's early values
understate later gains; a fixed rule chosen from them errs towards a smaller LR and more updates.
Every reason names the value used (`noise_scale_source`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from towerbench.config.grid import budget_factor, noise_budget
from towerbench.config.optimizers import (
    ALL_HYPERPARAMETERS,
    LAYER_WISE,
    adascale_power,
    effective_hyperparameters,
    family,
)
from towerbench.config.recipe_file import Choice

ScalingRule = Literal["none", "linear", "sqrt", "adascale"]
Budget = Literal["epochs", "updates", "noise", "tau"]

# A fixed rule is used when its factor is within this ratio of the predicted gain.
RULE_TOLERANCE = 1.25
WARMUP_FRACTION = 1 / 6  # cure-bn: 2 of 12 epochs
MAX_WARMUP_EPOCHS = 5.0  # Goyal et al.
# An LR schedule that still stands above this fraction of its peak at the end is not annealed.
ANNEALED = 0.1
# BatchNorm's moving statistics lag enough to act on when re-estimating them gains this much.
BATCH_NORM_LAG = 0.01


@dataclass(frozen=True)
class Measurements:
    """What the probe measured and the run to be scaled (the reference: 1 tower at
    `reference_batch`, `base_lr`, `epochs`, the user's decay)."""

    towers: int  # over all workers
    per_tower_batch: int
    reference_batch: int
    base_lr: float
    epochs: float
    has_batchnorm: bool
    noise_scale: float | None = None
    noise_scale_source: str = "probe"  # which value: e.g. "probe, first 300 steps"
    largest_stable_lr: float | None = None  # at the K-tower batch; None: not probed
    instability: str | None = None  # what happened above it
    decay: str = "staircase"
    decay_epochs: float = 350.0
    decay_factor: float = 0.1
    decay_boundaries: tuple[float, ...] = ()
    optimizer: str = "sgd"
    optimizer_values: tuple[tuple[str, float], ...] = ()  # the user's hyperparameters
    weight_decay: float = 0.0
    train_examples: int | None = None  # an epoch; None: no cost predicted
    step_seconds: float | None = None  # the probe's wall time per K-tower step
    device_kind: str | None = None  # where the probe's K towers ran (model.devices)
    # With BatchNorm, after the largest stable LR trial's steps at the K-tower batch: accuracy
    # on training batches with the moving statistics and re-estimated at the weights.
    accuracy_moving_bn: float | None = None
    accuracy_recomputed_bn: float | None = None
    batch_norm_steps: int | None = None

    def __post_init__(self) -> None:
        for name in ("towers", "per_tower_batch", "reference_batch", "base_lr", "epochs"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")

    @property
    def global_batch(self) -> int:
        return self.towers * self.per_tower_batch

    @property
    def scale(self) -> float:
        """k = B / b0."""
        return self.global_batch / self.reference_batch

    @property
    def usable_noise_scale(self) -> float | None:
        value = self.noise_scale
        return value if value is not None and math.isfinite(value) and value > 0 else None


@dataclass(frozen=True)
class Prediction:
    """What the recipe's K-tower run is predicted to cost, against the 1-tower reference."""

    steps: int  # optimizer steps of the K-tower run
    reference_steps: int  # ... of the 1-tower reference
    seconds: float | None  # steps x the probe's time per K-tower step (None: not timed)
    step_seconds: float | None
    devices: int  # K (over all workers)
    logical: bool  # the probe's towers were logical devices split from one

    def text(self) -> str:
        """`predicted 1,832 optimizer steps (the 1-tower reference: 4,000) ≈ 73 s on 4 devices
        (...)`."""
        steps = f"{self.steps:,} optimizer steps (the 1-tower reference: {self.reference_steps:,})"
        if self.seconds is None or self.step_seconds is None:
            return f"predicted {steps}; time not predicted (the probe timed no step)"
        caveat = "; prediction; towers are logical devices" if self.logical else ""
        return (
            f"predicted {steps} ≈ {self.seconds:.3g} s of training steps on {self.devices} "
            f"devices ({self.step_seconds:.3g} s per step at the K-tower batch, measured by the "
            f"probe{caveat})"
        )


@dataclass(frozen=True)
class Recipe:
    lr_scaling: Choice
    warmup_epochs: Choice
    budget: Choice
    decay: Choice
    predicted_gain: float | None
    optimizer: Choice
    hyperparameters: dict[str, float]  # the optimizer's, as the K-tower run uses them
    noise_scale: float | None = None  # the one `budget: noise` uses
    prediction: Prediction | None = None
    if_diverged: str = ""  # the probe's advice should the recipe's runs diverge
    batch_norm: Choice = Choice("moving", "no BatchNorm")  # its statistics: moving, ema_rule, ...

    def lines(self) -> list[str]:
        """`scaling: sqrt — reason`, one per choice, then the predicted cost."""
        cost = [] if self.prediction is None else [f"cost: {self.prediction.text()}"]
        return [
            f"{name}: {choice.value:g} — {choice.reason}"
            if isinstance(choice.value, float)
            else f"{name}: {choice.value} — {choice.reason}"
            for name, choice in (
                ("optimizer", self.optimizer),
                ("scaling", self.lr_scaling),
                ("warmup epochs", self.warmup_epochs),
                ("budget", self.budget),
                ("schedule", self.decay),
                ("batchnorm statistics", self.batch_norm),
            )
        ] + cost

    @property
    def sweep_budget(self) -> Literal["epochs", "updates", "noise"]:
        """The budget as `sweep.budget` says it (adascale's tau budget runs unstretched:
        `epochs` counts reference epochs)."""
        value = self.budget.value
        return value if value in ("updates", "noise") else "epochs"  # type: ignore[return-value]

    def sections(self) -> dict[str, dict[str, object]]:
        """The recipe as params.yaml's `train:` and `sweep:` values."""
        sweep: dict[str, object] = {
            "lr_scaling": [self.lr_scaling.value],
            "warmup_epochs": [self.warmup_epochs.value],
            "budget": self.sweep_budget,
        }
        if self.sweep_budget == "noise":
            sweep["noise_scale"] = self.noise_scale
        train: dict[str, object] = {"decay": self.decay.value}
        if self.batch_norm.value == "ema_rule":
            train["ema_scaling"] = "ema_rule"
        elif self.batch_norm.value == "recomputed":
            train["eval_bn"] = "recomputed"
        return {"train": train, "sweep": sweep}


def predicted_gain(noise_scale: float, reference_batch: int, global_batch: int) -> float:
    """r = (1 + B_noise/b0) / (1 + B_noise/B): how much larger an LR batch B can use."""
    return (1 + noise_scale / reference_batch) / (1 + noise_scale / global_batch)


def choose_recipe(measured: Measurements) -> Recipe:
    """The recipe for `measured` (see the module's docstring for the rules)."""
    noise = measured.usable_noise_scale
    gain = None
    if noise is not None and measured.scale > 1:
        gain = predicted_gain(noise, measured.reference_batch, measured.global_batch)
    scaling = _scaling(measured, gain)
    rule = str(scaling.value)
    values = effective_hyperparameters(
        measured.optimizer,
        {name: 0.0 for name in ALL_HYPERPARAMETERS} | dict(measured.optimizer_values),
        rule,
        measured.scale,
        measured.weight_decay,
    ).items()
    budget = _budget(measured, gain, rule)
    return Recipe(
        lr_scaling=scaling,
        warmup_epochs=_warmup(measured, rule),
        budget=budget,
        decay=_decay(measured, rule),
        predicted_gain=gain,
        optimizer=_optimizer(measured, rule, values),
        hyperparameters=values,
        noise_scale=noise if budget.value == "noise" else None,
        prediction=predict(measured, str(budget.value), gain),
        if_diverged=stability_advice(measured, rule),
        batch_norm=_batch_norm(measured),
    )


def _batch_norm(measured: Measurements) -> Choice:
    """Keras' moving BatchNorm statistics, unless the probe measured them lagging the weights
    at the K-tower batch: then the EMA rule (a larger batch) or re-estimated statistics."""
    if not measured.has_batchnorm:
        return Choice("moving", "no BatchNorm: no statistics count steps")
    moving, recomputed = measured.accuracy_moving_bn, measured.accuracy_recomputed_bn
    if moving is None or recomputed is None:
        return Choice("moving", "BatchNorm, but no stable LR trial measured its lag: Keras' kept")
    lag = recomputed - moving
    seen = (
        f"after the probe's {measured.batch_norm_steps} steps at batch {measured.global_batch}, "
        f"training batches scored {100 * moving:.1f}% with the moving statistics and "
        f"{100 * recomputed:.1f}% re-estimated at the weights ({100 * lag:+.1f} pp)"
    )
    if lag < BATCH_NORM_LAG:
        return Choice("moving", f"{seen}: no lag worth curing, Keras' moving statistics kept")
    if measured.scale > 1:
        return Choice(
            "ema_rule",
            f"{seen}: they move once per step, and batch {measured.global_batch} makes "
            f"{measured.scale:g}× fewer; the EMA rule raises BatchNorm's momentum m to "
            f"m^{measured.scale:g} (Busbridge et al. 2023) so they keep up",
        )
    return Choice("recomputed", f"{seen}: evaluate with statistics re-estimated at the weights")


def stability_advice(measured: Measurements, rule: str) -> str:
    """What to change, and to what value, if the recipe's runs diverge: a peak LR half the
    largest the probe found stable at the K-tower batch, or a tenth of the base LR when none
    was (or none was probed)."""
    base, batch = measured.base_lr, measured.global_batch
    factor = {"linear": measured.scale, "sqrt": math.sqrt(measured.scale)}.get(rule, 1.0)
    stable = measured.largest_stable_lr
    seen = f"; {measured.instability}" if measured.instability else ""
    if not stable:
        found = "no LR" if stable == 0.0 else "no LR probed"
        return (
            f"lower train.base_lr from {base:g} to {base / 10:.3g} (a tenth: the probe found "
            f"{found} stable at batch {batch}{seen}) and advise again"
        )
    peak = min(stable, base * factor) / 2
    return (
        f"lower train.base_lr from {base:g} to {peak / factor:.3g} (a peak LR of {peak:.3g} at "
        f"batch {batch} under {rule} scaling: half the largest LR the probe found stable there, "
        f"{stable:.3g}{seen}) and advise again"
    )


def _steps(epochs: float, examples: int, batch: int) -> int:
    """A run's optimizer steps: `epochs` epochs of ceil(examples / batch) steps (model.training)."""
    return max(round(epochs * -(-examples // batch)), 1)


def predict(measured: Measurements, budget: str, gain: float | None) -> Prediction | None:
    """The K-tower run's optimizer steps under `budget` and its wall time at the probe's step
    time (None without the number of training examples). Under adascale (`tau`): the
    reference's updates over the predicted gain (the updates themselves without one)."""
    examples = measured.train_examples
    if examples is None:
        return None
    batch, reference = measured.global_batch, measured.reference_batch
    one_tower = measured.per_tower_batch
    noise = measured.usable_noise_scale if budget == "noise" else None
    sweep_budget = "updates" if budget == "updates" else ("noise" if noise else "epochs")

    def factor(size: int, rule: str) -> float:
        return budget_factor(size, reference, rule, sweep_budget, noise)

    if budget == "tau":
        steps = _steps(measured.epochs * batch / reference / (gain or 1.0), examples, batch)
    else:
        steps = _steps(measured.epochs * factor(batch, "linear"), examples, batch)
    seconds = None if measured.step_seconds is None else steps * measured.step_seconds
    return Prediction(
        steps=steps,
        reference_steps=_steps(measured.epochs * factor(one_tower, "none"), examples, one_tower),
        seconds=seconds,
        step_seconds=measured.step_seconds,
        devices=measured.towers,
        logical=(measured.device_kind or "").startswith("logical"),
    )


def _optimizer(measured: Measurements, rule: str, values: dict[str, float]) -> Choice:
    """The user's optimizer, with its hyperparameters at the K-tower batch; the layer-wise one
    of its family named when no rule could scale the LR."""
    shown = ", ".join(f"{name} {value:.4g}" for name, value in values.items()) or "no others"
    how = {
        "sqrt": f"the square-root rule (Malladi et al. 2022) at k = {measured.scale:g}",
        "adascale": "AdaScale's gain to the power 1/2 (AdamScale)",
    }
    if family(measured.optimizer) == "adaptive" and rule in how:
        reason = f"adaptive, scaled by {how[rule]}: {shown}"
    else:
        reason = f"{family(measured.optimizer)} family: {shown}"
    layer_wise = "lamb" if family(measured.optimizer) == "adaptive" else "lars"
    if rule == "none" and measured.scale > 1 and measured.optimizer not in LAYER_WISE:
        paper = "You et al. 2019" if layer_wise == "lamb" else "You et al. 2017"
        reason += (
            f"; no rule scaled the LR stably: {layer_wise} gives each layer its own LR "
            f"({paper} trained batches the plain rules diverged at; untested here)"
        )
    return Choice(measured.optimizer, reason)


def _batch_against_noise(measured: Measurements) -> str:
    """`global batch 512 is 2.6× the noise scale 196 (probe)`."""
    noise, batch = measured.usable_noise_scale, measured.global_batch
    if noise is None:
        raise ValueError("no usable noise scale to set the batch against")
    ratio = batch / noise
    relation = "well below" if ratio < 0.5 else f"{ratio:.1f}×"
    source = measured.noise_scale_source
    return f"global batch {batch} is {relation} the noise scale {noise:.0f} ({source})"


def _factors(measured: Measurements, gain: float | None) -> dict[str, float]:
    """Each rule's LR factor: for adaptive optimizers sqrt's and AdamScale's (the gain to the
    power 1/2), for the SGD family linear's, sqrt's and AdaScale's."""
    factors = {"sqrt": math.sqrt(measured.scale)}
    if family(measured.optimizer) == "sgd":
        factors = {"linear": measured.scale, **factors}
    return factors if gain is None else {**factors, "adascale": _lr_gain(measured, gain)}


def _lr_gain(measured: Measurements, gain: float) -> float:
    """The LR factor the predicted gain asks of this optimizer."""
    return gain ** adascale_power(measured.optimizer)


def _unstable(measured: Measurements, factor: float) -> bool:
    limit = measured.largest_stable_lr
    return limit is not None and measured.base_lr * factor > limit * (1 + 1e-9)


def _excluded(measured: Measurements, rule: str, factor: float) -> str:
    """`linear's LR 0.4 is above the largest stable LR 0.3 at batch 512 (at 0.4: ...)`."""
    lr = measured.base_lr * factor
    above = f" ({measured.instability})" if measured.instability else ""
    return (
        f"{rule}'s LR {lr:.3g} is above the largest stable LR {measured.largest_stable_lr:.3g} "
        f"at batch {measured.global_batch}{above}"
    )


def _scaling(measured: Measurements, gain: float | None) -> Choice:
    batch, reference = measured.global_batch, measured.reference_batch
    if measured.scale <= 1:
        return Choice("none", f"global batch {batch} is not above the reference batch {reference}")
    factors = _factors(measured, gain)
    stable = {rule: f for rule, f in factors.items() if not _unstable(measured, f)}
    excluded = [_excluded(measured, rule, f) for rule, f in factors.items() if rule not in stable]
    caveat = "".join(f"; {text}" for text in excluded)
    if not stable:
        instability = f" ({measured.instability})" if measured.instability else ""
        if _unstable(measured, 1.0):
            return Choice(
                "none",
                f"not even the base LR {measured.base_lr:g} was stable at batch {batch}: no "
                "rule scales it up; this recipe is likely to diverge too: "
                f"{stability_advice(measured, 'none')} (or use fewer towers)",
            )
        return Choice(
            "none",
            f"even sqrt's LR {measured.base_lr * factors['sqrt']:.3g} is above the largest "
            f"stable LR {measured.largest_stable_lr:.3g} at batch {batch}: keep the base LR "
            f"{measured.base_lr:g}{instability}",
        )
    if gain is None:
        preferred = ("linear", "sqrt") if measured.has_batchnorm else ("sqrt", "linear")
        rule = next(rule for rule in preferred if rule in stable)
        why = (
            "adaptive optimizers follow the square-root rule (Malladi et al. 2022)"
            if family(measured.optimizer) == "adaptive"
            else "BatchNorm networks nearly follow the linear rule (Goyal et al.; You et al.)"
            if measured.has_batchnorm
            else "without BatchNorm the linear rule is unreliable (You et al.; LRN diverged here)"
        )
        return Choice(
            rule,
            f"no noise scale measured; {why}: LR {measured.base_lr * stable[rule]:.3g} at "
            f"batch {batch}{caveat}",
        )
    clause = f"{_batch_against_noise(measured)}: predicted gain {gain:.2f} of {measured.scale:g}"
    if family(measured.optimizer) == "adaptive":
        clause += f", an LR factor of {_lr_gain(measured, gain):.2f} for an adaptive optimizer"
    gain = _lr_gain(measured, gain)
    fixed = {rule: f for rule, f in stable.items() if rule != "adascale"}
    near = {rule: f for rule, f in fixed.items() if _distance(f, gain) <= math.log(RULE_TOLERANCE)}
    if near:
        rule = min(near, key=lambda name: _distance(near[name], gain))
        return Choice(rule, f"{clause}, within 25% of {rule}'s {near[rule]:.2f}{caveat}")
    if "adascale" in stable:
        named = ", ".join(f"{rule} {f:.2f}" for rule, f in _factors(measured, None).items())
        return Choice(
            "adascale",
            f"{clause}: no fixed rule within 25% ({named}); AdaScale applies the gain it "
            f"measures at each step{caveat}",
        )
    rule = min(fixed, key=lambda name: _distance(fixed[name], gain))
    return Choice(rule, f"{clause}: the nearest stable rule is {rule} ({fixed[rule]:.2f}){caveat}")


def _distance(factor: float, gain: float) -> float:
    return abs(math.log(factor / gain))


def _warmup(measured: Measurements, rule: str) -> Choice:
    if rule == "none":
        return Choice(0.0, "the LR is not scaled up: nothing to warm up to")
    if rule == "adascale":
        return Choice(
            0.0,
            "AdaScale's gain starts from what the gradients allow; Johnson et al. train without "
            "warmup",
        )
    factor = measured.scale if rule == "linear" else math.sqrt(measured.scale)
    epochs = measured.epochs
    warmup = min(max(round(2 * WARMUP_FRACTION * epochs) / 2, 1.0), MAX_WARMUP_EPOCHS, epochs / 2)
    return Choice(
        warmup,
        f"{rule} scaling starts at LR {measured.base_lr * factor:.3g}, {factor:.2f}× the base "
        f"LR: warm up over {warmup:g} of {epochs:g} epochs (a sixth, 1 to 5; cure-bn: 2 of 12)",
    )


def _budget(measured: Measurements, gain: float | None, rule: str) -> Choice:
    scale = measured.scale
    if scale <= 1:
        return Choice("epochs", "at the reference batch, epochs and updates are the same budget")
    if rule == "adascale":
        return Choice(
            "tau",
            f"AdaScale ends when its progress tau reaches the reference's updates "
            f"({measured.epochs:g} epochs at batch {measured.reference_batch}): between "
            f"{measured.epochs:g} and {measured.epochs * scale:g} epochs, as the gain decides",
        )
    noise = measured.usable_noise_scale
    if gain is None or noise is None:
        return Choice(
            "updates",
            f"no noise scale measured: equal updates ({scale:g}× the epochs, Hoffer et al.) "
            "cannot fall short",
        )
    needed = noise_budget(noise, measured.reference_batch, measured.global_batch)
    return Choice(
        "noise",
        f"{_batch_against_noise(measured)}: equal progress needs (1 + B/B_noise) / "
        f"(1 + b0/B_noise) = {needed:.2f}× the epochs (McCandlish et al.): "
        f"{measured.epochs * needed:.3g} epochs, against {measured.epochs * scale:g} for equal "
        "updates and "
        f"{measured.epochs:g} for equal epochs",
    )


def _final_multiplier(measured: Measurements) -> float:
    """The decay's LR multiplier at the run's last epoch."""
    epochs, factor = measured.epochs, measured.decay_factor
    if measured.decay in ("cosine", "linear"):
        return 0.0
    if measured.decay == "staircase":
        return factor ** math.floor(epochs / measured.decay_epochs)
    if measured.decay == "piecewise":
        return factor ** sum(boundary <= epochs for boundary in measured.decay_boundaries)
    return 1.0


def _decay(measured: Measurements, rule: str) -> Choice:
    at_tau = ", evaluated at tau (in reference epochs)" if rule == "adascale" else ""
    final = _final_multiplier(measured)
    if final <= ANNEALED:
        return Choice(
            measured.decay,
            f"{measured.decay} ends at {final:g}× the peak LR: annealed, kept{at_tau}",
        )
    return Choice(
        "linear",
        f"{measured.decay} leaves the LR at {final:g}× its peak after {measured.epochs:g} epochs: "
        f"decay it linearly to 0{at_tau} (annealed, cure-bn's 4 towers came within 0.4 pp)",
    )
