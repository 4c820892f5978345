"""The metrics a run can be judged by (`train.metric`), their direction and the losses they fit.

`accuracy` (a class per example: the argmax against the class id or the label row's largest
value), `binary_accuracy` (each column of a 0/1 row, its logit's sign against the label's side
of 0.5, averaged over columns and examples), `auc` (ROC AUC over every example's every column,
from the logits), `mae` and `rmse` (over every example's every column): the first three higher
is better, the last two lower. `auto` takes the loss's own: accuracy for the categorical
cross-entropies (and a user's loss on class ids), binary_accuracy for binary_crossentropy, mae
for mse, mae and huber.

Plain Python: the config, the checks and the report read it without TensorFlow.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from towerbench.config.losses import LOSS_LABELS, judged_by_accuracy
from towerbench.core.tfrecord_format import LabelKind

MetricName = Literal["auto", "accuracy", "binary_accuracy", "auc", "mae", "rmse"]
BINARY_LOSSES = frozenset({"binary_crossentropy"})
REGRESSION_LOSSES = frozenset({"mse", "mae", "huber"})


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
        """A score as the metric's value: `84.20%`, `0.1234`; `—` when there is none."""
        if score is None or not math.isfinite(score):
            return "—"
        value = self.value(score)
        return f"{100 * value:.{digits}f}%" if self.share else f"{value:.{digits + 2}g}"

    def amount(self, size: float, digits: int = 1) -> str:
        """A size in the metric's units: `1.0 pp`, `0.012`."""
        return f"{100 * size:.{digits}f} pp" if self.share else f"{size:.{digits + 1}g}"

    def signed(self, score_difference: float, digits: int = 1) -> str:
        """A difference of scores as the value's change, signed with a true minus, without
        units: `−1.2` (accuracy fell, in pp), `+0.012` (MAE rose)."""
        return self.signed_value(self.value(score_difference), digits)

    def signed_value(self, difference: float, digits: int = 1) -> str:
        """A difference of values, signed, without units: `−1.2` (a share, in pp), `+0.012`."""
        difference += 0.0  # no −0
        text = f"{100 * difference:+.{digits}f}" if self.share else f"{difference:+.{digits + 1}g}"
        return text.replace("-", "−", 1) if text.startswith("-") else text  # not in e-08

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
        return f"{'−' if self.higher_is_better else '+'}{margin:.3g}"


METRICS: dict[str, Metric] = {
    "accuracy": Metric("accuracy", "accuracy", True, True),
    "binary_accuracy": Metric("binary_accuracy", "binary accuracy", True, True),
    "auc": Metric("auc", "AUC", True, False),
    "mae": Metric("mae", "MAE", False, False),
    "rmse": Metric("rmse", "RMSE", False, False),
}


def _fitting(loss: str, held: LabelKind) -> tuple[str, ...]:
    """The metrics that can judge `loss` on labels of kind `held`, its own first."""
    if judged_by_accuracy(loss, held):
        return ("accuracy",)
    if loss in BINARY_LOSSES:
        return ("binary_accuracy", "auc")
    if loss in REGRESSION_LOSSES:
        return ("mae", "rmse")
    return ("binary_accuracy", "auc", "mae", "rmse")  # the user's own loss on label rows


def resolved_metric(metric: str, loss: str, held: LabelKind) -> str:
    """`metric`, or for `auto` the loss's own; ValueError in one line when it does not fit
    `loss` on labels of kind `held` (or `auto` has no own metric: the user's loss on rows)."""
    fitting = _fitting(loss, held)
    if metric == "auto":
        if loss not in LOSS_LABELS and held == "rows":
            raise ValueError(
                f"--metric: your loss {loss} on label rows has no metric of its own: pass "
                f"--metric {' or '.join(fitting)}"
            )
        return fitting[0]
    if metric not in fitting:
        raise ValueError(
            f"--metric {metric} does not fit --loss {loss}: it is judged by {' or '.join(fitting)}"
        )
    return metric
