"""The metrics of config/metrics.py other than accuracy, computed on a whole split's label rows
and outputs (numpy arrays of shape (examples, columns))."""

from __future__ import annotations

import math

import numpy as np


def binary_accuracy(labels: np.ndarray, logits: np.ndarray) -> float:
    """The share of (example, column) pairs whose logit is on the label's side: > 0 for a label
    above 0.5."""
    return float(np.mean((logits > 0) == (labels > 0.5)))


def _average_ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks of `values`, ties given their mean rank."""
    order = np.argsort(values, kind="stable")
    sorted_values = values[order]
    starts = np.flatnonzero(np.r_[True, sorted_values[1:] != sorted_values[:-1]])
    ends = np.r_[starts[1:], len(values)]
    ranks = np.empty(len(values))
    ranks[order] = np.repeat((starts + ends + 1) / 2, ends - starts)
    return ranks


def auc(labels: np.ndarray, logits: np.ndarray) -> float:
    """ROC AUC over every (example, column) pair (micro-averaged), labels above 0.5 positive:
    the chance a positive outscores a negative (Mann-Whitney U, ties counting half); NaN when
    the split has only one side."""
    positive = labels.ravel() > 0.5
    count, negatives = int(positive.sum()), int((~positive).sum())
    if count == 0 or negatives == 0:
        return math.nan
    ranks = _average_ranks(logits.ravel())
    return float((ranks[positive].sum() - count * (count + 1) / 2) / (count * negatives))


def mae(labels: np.ndarray, outputs: np.ndarray) -> float:
    return float(np.mean(np.abs(outputs - labels)))


def rmse(labels: np.ndarray, outputs: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(outputs - labels))))


VALUES = {"binary_accuracy": binary_accuracy, "auc": auc, "mae": mae, "rmse": rmse}
