"""The metrics a run can be judged by (`train.metric`) and the losses they fit (how each reads,
its direction and scores: core.metrics).

`accuracy` (a class per example: the argmax against the class id or the label row's largest
value), `binary_accuracy` (each column of a 0/1 row, its logit's sign against the label's side
of 0.5, averaged over columns and examples), `auc` (ROC AUC over every example's every column,
from the logits), `mae` and `rmse` (over every example's every column), `recall_at_K` (K in 1,
5, 10, 50, 100; in prose recall@K: the share of test queries whose own candidate ranks among the
K best-scored of a fixed set of test candidates, model.metric_values.recall_at): the mae and rmse
lower is better, the others higher. `auto` takes the loss's own: accuracy for the categorical
cross-entropies (and a user's loss on class ids), binary_accuracy for binary_crossentropy, mae
for mse, mae and huber, recall_at_10 for in_batch_softmax.

Plain Python: the config, the checks and the report read it without TensorFlow.
"""

from __future__ import annotations

from typing import Literal

from towerbench.config.losses import EMBEDDING_PAIRS, LOSS_LABELS, judged_by_accuracy
from towerbench.core.metrics import RECALL_CUTOFFS
from towerbench.core.tfrecord_format import LabelKind

MetricName = Literal[
    "auto",
    "accuracy",
    "binary_accuracy",
    "auc",
    "mae",
    "rmse",
    "recall_at_10",
    "recall_at_1",
    "recall_at_5",
    "recall_at_50",
    "recall_at_100",
]
RECALLS = tuple(f"recall_at_{k}" for k in RECALL_CUTOFFS)
BINARY_LOSSES = frozenset({"binary_crossentropy"})
REGRESSION_LOSSES = frozenset({"mse", "mae", "huber"})


def _fitting(loss: str, held: LabelKind) -> tuple[str, ...]:
    """The metrics that can judge `loss` on labels of kind `held`, its own first."""
    if judged_by_accuracy(loss, held):
        return ("accuracy",)
    if loss in EMBEDDING_PAIRS:
        return RECALLS
    if loss in BINARY_LOSSES:
        return ("binary_accuracy", "auc")
    if loss in REGRESSION_LOSSES:
        return ("mae", "rmse")
    return ("binary_accuracy", "auc", "mae", "rmse")  # the user's own loss on label rows


def recall_cutoff(metric: str) -> int | None:
    """K of recall_at_K; None for another metric."""
    return int(metric.removeprefix("recall_at_")) if metric in RECALLS else None


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
