"""When a run has gone wrong, judged against chance level: ln C for C classes, the cross-entropy
of predicting 1/C for every class (ln 2 for binary_crossentropy; a regression loss has none).

Two verdicts: *diverged* stops a run at once (a step's loss is not a number or far above chance);
*unstable* flags a finished run whose learning collapsed on the way (see `instability`).
"""

from __future__ import annotations

import math

from towerbench.config.losses import chance_loss
from towerbench.model.records import EpochRecord

# A run is unstable when an epoch's mean training cross-entropy rises above chance level by this
# factor, or when its loss did not fall and it ends within this factor of chance accuracy.
UNSTABLE_LOSS_FACTOR = 1.05
UNSTABLE_ACCURACY_FACTOR = 2.0


def _chance(loss: str, classes: int) -> tuple[float | None, str]:
    """The loss's chance level (config.losses) and how to name it (`ln 10`); None for a
    regression loss, which has none."""
    chance = chance_loss(loss, classes)
    return chance, f"ln {2 if loss == 'binary_crossentropy' else classes}"


def diverged(
    cross_entropy: float,
    total_loss: float,
    classes: int,
    factor: float,
    loss: str = "sparse_categorical_crossentropy",
) -> bool:
    """A step's losses are NaN/inf, or its loss (`cross_entropy`) is above `factor` times
    chance level (a regression loss: only NaN/inf)."""
    finite = math.isfinite(cross_entropy) and math.isfinite(total_loss)
    chance, _ = _chance(loss, classes)
    return not finite or (chance is not None and cross_entropy > factor * chance)


def instability(
    history: list[EpochRecord],
    classes: int,
    test_accuracy: float,
    loss: str = "sparse_categorical_crossentropy",
) -> str | None:
    """Why this run counts as unstable (learning collapsed), or None. A regression loss has no
    chance level: only a loss that is not a number counts; and a run judged by another metric
    than accuracy (NaN) is never near chance accuracy."""
    chance, named = _chance(loss, classes)
    losses = [record.cross_entropy for record in history]
    worst = max(losses, default=0.0)
    if not math.isfinite(worst) and chance is None:
        return f"training loss reached {worst}"
    if not math.isfinite(worst) or (chance is not None and worst > UNSTABLE_LOSS_FACTOR * chance):
        epoch = history[losses.index(worst)].epoch if math.isfinite(worst) else None
        where = f" in epoch {math.ceil(epoch)}" if epoch is not None else ""
        return (
            f"training cross-entropy reached {worst:.2f}{where}, above chance level "
            f"{named} = {chance:.2f}"
        )
    # Near chance at the end after a loss that went nowhere or back up: collapsed, not just short.
    stalled = len(losses) >= 2 and losses[-1] >= losses[0]
    if stalled and test_accuracy < UNSTABLE_ACCURACY_FACTOR / classes:
        return (
            f"test accuracy {100 * test_accuracy:.1f}% is near chance ({100 / classes:.0f}%) "
            f"and the training cross-entropy did not fall ({losses[0]:.2f} -> {losses[-1]:.2f})"
        )
    return None
