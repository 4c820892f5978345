"""Interleaved timing and the confidence intervals of its ratios (arithmetic, no TensorFlow)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from towerbench.speed.summary import _judged
from towerbench.speed.timing import interleaved, ratio_interval


def _runs(calls: list[str], values) -> dict:
    def run(name: str):
        def measured() -> float:
            calls.append(name)
            return float(next(values[name]))

        return measured

    return {name: run(name) for name in values}


def test_interleaved_alternates_the_order_of_rounds_and_drops_warmup() -> None:
    calls: list[str] = []
    counter = iter(range(100))
    timings = interleaved(_runs(calls, {"a": counter, "b": counter}), repeats=3, warmup=1)
    assert calls == ["a", "b", "b", "a"] * 2
    assert timings["a"].seconds == (3.0, 4.0, 7.0) and timings["b"].median == 5.0


def test_the_interval_covers_the_true_ratio_and_narrows_with_rounds() -> None:
    rng = np.random.default_rng(0)
    noise = lambda n: np.exp(rng.normal(0, 0.05, n))  # noqa: E731 - 5% log-normal noise
    few = ratio_interval(1.2 * noise(5), noise(5))
    many = ratio_interval(1.2 * noise(200), noise(200))
    assert few.low < 1.2 < few.high and many.low < 1.2 < many.high
    assert many.relative_half_width < few.relative_half_width < 0.2
    single = ratio_interval([2.0], [1.0])
    assert single.ratio == 2.0 and math.isnan(single.low) and single.rounds == 1


def test_rounds_go_on_until_the_ratio_is_precise_or_time_is_up() -> None:
    rng = np.random.default_rng(1)
    values = {
        "ours": iter(1.05 * np.exp(rng.normal(0, 0.05, 10_000))),
        "peer": iter(np.exp(rng.normal(0, 0.05, 10_000))),
    }
    timings = interleaved(
        _runs([], values), repeats=3, warmup=0, pairs={("ours", "peer"): 0.03}, max_seconds=30
    )
    interval = ratio_interval(timings["ours"].seconds, timings["peer"].seconds)
    assert interval.rounds > 3 and interval.relative_half_width <= 0.03
    assert len(timings["ours"].seconds) == len(timings["peer"].seconds)
    capped = interleaved(
        _runs([], values), repeats=3, warmup=0, pairs={("ours", "peer"): 0.03}, max_seconds=0
    )
    assert len(capped["ours"].seconds) == 3  # no time for more: the interval stays wide


@pytest.mark.parametrize(
    ("figure", "met"),
    [
        ({"ratio": 0.95, "low": 0.93, "high": 0.97, "rounds": 9}, True),
        ({"ratio": 1.08, "low": 1.05, "high": 1.11, "rounds": 9}, False),
        ({"ratio": 0.99, "low": 0.90, "high": 1.08, "rounds": 9}, None),
        ({"ratio": 0.99, "low": None, "high": None, "rounds": 1}, None),
    ],
)
def test_a_target_is_judged_by_the_whole_interval(figure: dict, met: bool | None) -> None:
    text, judged = _judged(figure, 1.0, at_most=True)
    assert judged is met
    assert ("too wide to judge" in text) == (met is None and figure["low"] is not None)


def test_extra_rounds_go_only_to_the_ratios_still_imprecise() -> None:
    rng = np.random.default_rng(2)
    calls: list[str] = []
    values = {
        "ours": iter(np.exp(rng.normal(0, 0.05, 10_000))),
        "peer": iter(np.exp(rng.normal(0, 0.05, 10_000))),
        "steady": iter([1.0] * 10_000),
        "steady_peer": iter([2.0] * 10_000),
    }
    timings = interleaved(
        _runs(calls, values),
        repeats=3,
        warmup=0,
        pairs={("ours", "peer"): 0.03, ("steady", "steady_peer"): 0.03},
        max_seconds=30,
    )
    assert calls.count("steady") == 3 < calls.count("ours") == calls.count("peer")
    assert timings["steady"].seconds[3:] == (None,) * (len(timings["ours"].seconds) - 3)
    assert timings["steady"].median == 1.0
    interval = ratio_interval(timings["ours"].seconds, timings["peer"].seconds)
    assert interval.relative_half_width <= 0.03
    assert ratio_interval(timings["steady"].seconds, timings["steady_peer"].seconds).rounds == 3


def test_each_ratio_gets_the_rounds_its_own_precision_needs() -> None:
    rng = np.random.default_rng(4)
    calls: list[str] = []
    values = {name: iter(np.exp(rng.normal(0, 0.05, 10_000))) for name in ("a", "b", "c", "d")}
    timings = interleaved(
        _runs(calls, values),
        repeats=3,
        warmup=0,
        pairs={("a", "b"): 0.01, ("c", "d"): 0.05},
        max_seconds=30,
    )
    fine = ratio_interval(timings["a"].seconds, timings["b"].seconds)
    coarse = ratio_interval(timings["c"].seconds, timings["d"].seconds)
    assert fine.relative_half_width <= 0.01 and coarse.relative_half_width <= 0.05
    assert calls.count("a") == fine.rounds > coarse.rounds == calls.count("c") > 3
    # Each extra round times one pair, its two runs back to back.
    extra = zip(timings["a"].seconds[3:], timings["c"].seconds[3:], strict=True)
    assert all((a is None) != (c is None) for a, c in extra)
    pairs = [set(calls[index : index + 2]) for index in range(12, len(calls), 2)]
    assert all(pair in ({"a", "b"}, {"c", "d"}) for pair in pairs)
