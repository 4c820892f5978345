"""Which gradient noise scale advises a batch size: the harmonic mean of its values over training.

The noise scale B_noise (model.noise_scale: an average over about the last 100 steps) grows as
the loss falls (McCandlish et al. 2018): on cure-bn, with the LR annealed to 0, its final value
read 9,228 where the LRN runs read 160-430. Its final value therefore says little about the batch
the whole run could use.

What a batch B costs: reaching a loss takes E = E_min (1 + B / B_noise) examples, where E_min is
the fewest any batch needs (McCandlish et al.'s model, with the critical batch ~ B_noise; the
steps are S = S_min (1 + B_noise / B)). Over a run whose noise scale changes, the costs add up
segment by segment,
    E = E_min (1 + B * mean(1 / B_noise)) = E_min (1 + B / H),
with H the harmonic mean of B_noise over training. So H is the noise scale that decides whether
a fixed batch wastes examples, and the one the report's verdicts and the advise recipe use: a
batch well below H still pays off almost linearly, one far above it needs more epochs. The small,
early values dominate H (where a large batch does its harm); the large late ones barely move it.

Estimated here from one value per epoch (each epoch an equal share of the examples, standing in
for an equal share of E_min). Values that are not finite or not positive (the |G|^2 average was
still 0 or negative: noise dominated, a noise scale beyond measuring) are left out, which can
only lower H: the advice errs towards more updates.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

# The formulas a sweep's `budget: noise` applies live with the sweep's budgets (config/grid.py).
from towerbench.config.grid import epochs_needed, noise_budget

__all__ = ["EPOCHS_TOLERANCE", "advising_noise_scale", "epochs_needed", "noise_budget"]

# Equal epochs suffice when a batch needs at most this many times the reference's epochs
# (the report's verdicts and the advise recipe both judge by it).
EPOCHS_TOLERANCE = 1.25


def advising_noise_scale(per_epoch: Iterable[float | None]) -> float | None:
    """The harmonic mean of the positive, finite per-epoch noise scales; None without any."""
    usable = [value for value in per_epoch if value is not None and math.isfinite(value)]
    usable = [value for value in usable if value > 0]
    if not usable:
        return None
    return len(usable) / sum(1.0 / value for value in usable)
