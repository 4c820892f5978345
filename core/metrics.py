"""How each metric a run can be judged by reads (`train.metric`): its label, its direction, and
whether it is a share; and the scores the report compares (the value, negated when lower is
better). Plain Python, the bottom floor: the outcome, the config and the report read it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from towerbench.core.errors import TowerbenchError


@dataclass(frozen=True)
class Metric:
    """How a metric reads: its name in prose, its direction, and whether it is a share (shown
    in percent, differences in percentage points).

    The report compares *scores*: the value, negated when lower is better, so that a higher
    score is always better and one set of statistics serves every metric. These methods turn
    scores back into the metric's own values and words."""

    name: str
    label: str  # "accuracy", "MAE"
    higher_is_better: bool
    share: bool

    def score(self, value: float) -> float:
        """The value as a score (higher is better); `value` of a score is the same flip."""
        return value if self.higher_is_better else -value

    value = score

    def shown(self, score: float | None, digits: int = 2) -> str:
        """A score as the metric's value: `84.20%`, `0.1234`, `1235`; `—` when there is none."""
        if score is None or not math.isfinite(score):
            return "—"
        value = self.value(score)
        return f"{100 * value:.{digits}f}%" if self.share else _significant(value, digits + 2)

    def amount(self, size: float, digits: int = 1) -> str:
        """A size in the metric's units: `1.0 pp`, `0.012`."""
        return f"{100 * size:.{digits}f} pp" if self.share else _significant(size, digits + 1)

    def signed(self, score_difference: float, digits: int = 1) -> str:
        """A difference of scores as the value's change, signed with a true minus, without
        units: `−1.2` (accuracy fell, in pp), `+0.012` (MAE rose)."""
        return self.signed_value(self.value(score_difference), digits)

    def signed_value(self, difference: float, digits: int = 1) -> str:
        """A difference of values, signed, without units: `−1.2` (a share, in pp), `+0.012`."""
        difference += 0.0  # no −0
        if self.share:
            text = f"{100 * difference:+.{digits}f}"
        else:
            text = _significant(difference, digits + 1, sign=True)
        return text.replace("-", "−", 1)

    @property
    def units(self) -> str:
        return " pp" if self.share else ""

    def change(self, score_difference: float, digits: int = 1) -> str:
        """`signed` with its units: `−1.2 pp`, `+0.012`."""
        return self.signed(score_difference, digits) + self.units

    def interval(self, low: float, high: float, digits: int = 1) -> str:
        """A score difference's interval as the value's, low first: `[−2.0, −0.4]`."""
        ends = (low, high) if self.higher_is_better else (high, low)
        return f"[{', '.join(self.signed(end, digits) for end in ends)}]"

    @property
    def better(self) -> str:
        """Which side of a bound is the better one: `above` or `below`."""
        return "above" if self.higher_is_better else "below"

    @property
    def worse(self) -> str:
        return "below" if self.higher_is_better else "above"

    def default_margin(self, baseline_score: float) -> float:
        """report.margin when not set: 1 pp of a share or of AUC, 1% of 1 tower's value of an
        error (MAE, RMSE), whose units are the labels'."""
        if self.higher_is_better:
            return 0.01
        return 0.01 * abs(baseline_score)

    def bound(self, margin: float) -> str:
        """The bound a difference is held against: `−1 pp` (a share), `+0.012` (an error)."""
        if self.share:
            return f"−{100 * margin:g} pp"
        return f"{'−' if self.higher_is_better else '+'}{_significant(margin, 3)}"

    def check_bounded(self, value: float, what: str, up_to_one: bool = False) -> None:
        """A share or AUC lies in [0, 1]: a margin of 1 or more (a target above 1) is a misread
        unit, refused in one line naming `what`; an error's (MAE, RMSE) is the labels' units."""
        if self.higher_is_better and (value > 1 if up_to_one else value >= 1):
            raise TowerbenchError(
                f"{what} {value:g}: {self.label} is judged as a fraction (0.01 = 1 pp), so it "
                f"must be {'at most' if up_to_one else 'below'} 1"
            )


def _significant(value: float, digits: int, sign: bool = False) -> str:
    """`value` to `digits` significant digits, never in exponent form: `0.0123`, `1235`."""
    return np.format_float_positional(
        value, precision=digits, unique=False, fractional=False, trim="-", sign=sign
    )


RECALL_CUTOFFS = (10, 1, 5, 50, 100)  # recall@K's K, in_batch_softmax's own first
METRICS: dict[str, Metric] = {
    "accuracy": Metric("accuracy", "accuracy", True, True),
    "binary_accuracy": Metric("binary_accuracy", "binary accuracy", True, True),
    "auc": Metric("auc", "AUC", True, False),
    "mae": Metric("mae", "MAE", False, False),
    "rmse": Metric("rmse", "RMSE", False, False),
} | {f"recall_at_{k}": Metric(f"recall_at_{k}", f"recall@{k}", True, True) for k in RECALL_CUTOFFS}
