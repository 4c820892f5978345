"""When a run has gone wrong, judged against chance level: ln C for C classes, the cross-entropy
of predicting 1/C for every class.

Two verdicts: *diverged* stops a run at once (a step's loss is not a number or far above chance);
*unstable* flags a finished run whose learning collapsed on the way (see `instability`).
"""

from __future__ import annotations

import math

from towerbench.model.records import EpochRecord

# A run is unstable when an epoch's mean training cross-entropy rises above chance level by this
# factor, or when its loss did not fall and it ends within this factor of chance accuracy.
UNSTABLE_LOSS_FACTOR = 1.05
UNSTABLE_ACCURACY_FACTOR = 2.0


def diverged(cross_entropy: float, total_loss: float, classes: int, factor: float) -> bool:
    """A step's losses are NaN/inf, or its cross-entropy is above `factor` times chance level."""
    finite = math.isfinite(cross_entropy) and math.isfinite(total_loss)
    return not finite or cross_entropy > factor * math.log(classes)


def instability(history: list[EpochRecord], classes: int, test_accuracy: float) -> str | None:
    """Why this run counts as unstable (learning collapsed), or None."""
    chance_loss = math.log(classes)
    losses = [record.cross_entropy for record in history]
    worst = max(losses, default=0.0)
    if not math.isfinite(worst) or worst > UNSTABLE_LOSS_FACTOR * chance_loss:
        epoch = history[losses.index(worst)].epoch if math.isfinite(worst) else None
        where = f" in epoch {math.ceil(epoch)}" if epoch is not None else ""
        return (
            f"training cross-entropy reached {worst:.2f}{where}, above chance level "
            f"ln {classes} = {chance_loss:.2f}"
        )
    # Near chance at the end after a loss that went nowhere or back up: collapsed, not just short.
    stalled = len(losses) >= 2 and losses[-1] >= losses[0]
    if stalled and test_accuracy < UNSTABLE_ACCURACY_FACTOR / classes:
        return (
            f"test accuracy {100 * test_accuracy:.1f}% is near chance ({100 / classes:.0f}%) "
            f"and the training cross-entropy did not fall ({losses[0]:.2f} -> {losses[-1]:.2f})"
        )
    return None
