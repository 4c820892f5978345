"""The metrics of config/metrics.py other than accuracy, computed on a whole split's label rows
and outputs (numpy arrays of shape (examples, columns)); recall@K on its candidate ids and
embedding pairs (examples, 2, d)."""

from __future__ import annotations

import math
from typing import NamedTuple

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


class Retrieval(NamedTuple):
    """Test queries ranked against one fixed set of test candidates."""

    loss: float  # mean cross-entropy of a query's own candidate among the set's
    recall: float  # share of queries whose own candidate ranks among the K best
    queries: int  # the queries whose candidate is in the set
    candidates: int


def fixed_candidates(ids: np.ndarray, limit: int) -> np.ndarray:
    """The index of the first example of each of the first `limit` distinct ids, in the split's
    order: the same set whatever the towers or batches."""
    _, first = np.unique(ids, return_index=True)
    return np.sort(first)[:limit]


def retrieval(
    ids: np.ndarray, pairs: np.ndarray, k: int, limit: int, temperature: float = 1.0
) -> Retrieval:
    """Every query (pairs[:, 0]) whose candidate id is among the fixed candidates (pairs[:, 1]
    of `fixed_candidates`) scored against all of them, q·cᵀ / `temperature`: recall@`k` and the
    softmax loss over the set. A candidate scored equal to the query's own shares its place at
    random (counted by its expectation), so tied scores earn no recall; a query with a score
    that is not a number ranks nothing."""
    chosen = fixed_candidates(ids, limit)
    candidate_ids = ids[chosen]
    asked = np.isin(ids, candidate_ids)
    order = np.argsort(candidate_ids)
    own_column = order[np.searchsorted(candidate_ids, ids[asked], sorter=order)]
    queries = pairs[asked, 0].astype(np.float64)
    scores = queries @ pairs[chosen, 1].astype(np.float64).T / temperature
    own = scores[np.arange(len(queries)), own_column]
    better = (scores > own[:, None]).sum(1)
    tied = (scores == own[:, None]).sum(1) - 1
    recall = np.clip((k - better) / np.maximum(tied + 1, 1), 0, 1)
    recall[~np.isfinite(scores).all(1)] = 0.0  # a diverged model's scores rank nothing
    top = scores.max(1, keepdims=True)
    log_total = top[:, 0] + np.log(np.exp(scores - top).sum(1))
    return Retrieval(
        float(np.mean(log_total - own)), float(np.mean(recall)), len(queries), len(chosen)
    )
