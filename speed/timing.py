"""Wall times with competing measurements interleaved so load drift hits them alike, and the
confidence interval of their ratios.

The CPU here is shared (and on any machine clocks and caches drift), so a ratio of two figures
measured minutes apart mixes the thing measured with whatever else ran meanwhile. Running one
repeat of every candidate per round, round after round, exposes all of them to the same load; the
ratio of one round's two times is then one sample, and rounds go on until every ratio asked for
is known to the precision asked for (or time runs out).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass

from scipy import stats


@dataclass(frozen=True)
class Timing:
    """Seconds of each measured round (warm-up excluded); None for a round this run sat out."""

    seconds: tuple[float | None, ...]

    @property
    def measured(self) -> list[float]:
        return [value for value in self.seconds if value is not None]

    @property
    def median(self) -> float:
        return statistics.median(self.measured)


def time_once(run: Callable[[], object]) -> float:
    """Seconds taken by `run`, which must block until its work is done."""
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


@dataclass(frozen=True)
class RatioInterval:
    """The ratio of two interleaved timings (geometric mean of the per-round ratios) and its
    confidence interval; `low`/`high` are NaN below 2 rounds."""

    ratio: float
    low: float
    high: float
    rounds: int

    @property
    def relative_half_width(self) -> float:
        """How far the interval reaches from the ratio, as a fraction of it (inf if unknown)."""
        if math.isnan(self.low):
            return math.inf
        return max(self.high / self.ratio - 1, 1 - self.low / self.ratio)


def ratio_interval(
    numerator: Sequence[float | None],
    denominator: Sequence[float | None],
    confidence: float = 0.95,
) -> RatioInterval:
    """Student-t interval of the mean log ratio of paired rounds (those both were timed in),
    mapped back to a ratio."""
    logs = [
        math.log(a / b)
        for a, b in zip(numerator, denominator, strict=True)
        if a is not None and b is not None
    ]
    mean = statistics.fmean(logs)
    if len(logs) < 2:
        return RatioInterval(math.exp(mean), math.nan, math.nan, len(logs))
    margin = stats.t.ppf((1 + confidence) / 2, len(logs) - 1) * (
        statistics.stdev(logs) / math.sqrt(len(logs))
    )
    return RatioInterval(
        math.exp(mean), math.exp(mean - margin), math.exp(mean + margin), len(logs)
    )


def interleaved[Key: Hashable](
    runs: Mapping[Key, Callable[[], float]],
    repeats: int,
    warmup: int = 1,
    *,
    pairs: Mapping[tuple[Key, Key], float] | None = None,
    max_seconds: float = 0.0,
) -> dict[Key, Timing]:
    """Call every run `warmup + repeats` times, one call of each per round; then, while some
    ratio of `pairs` (numerator, denominator) has a 95% interval wider than ± its precision and
    these extra rounds have not yet taken `max_seconds`, more rounds of only the two runs of the
    ratio furthest from its precision, back to back: the cap's seconds go where they are short,
    and no other run comes between a pair's two timings. (The first rounds' length depends on
    the machine; the cap is on what comes after.)

    Each run measures itself and returns seconds per unit of work (a step, a product), so it can
    leave set-up it does not want timed out of the figure. Warm-up rounds absorb tracing, graph
    optimisation and allocator growth and are dropped. Every other round goes through the runs
    in reverse order, so a drift within a round favours neither side of a pair.
    """
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats must be >= 1 and warmup >= 0, got {repeats} and {warmup}")
    precisions = pairs or {}
    seconds: dict[Key, list[float | None]] = {name: [] for name in runs}

    def least_precise() -> list[Key]:
        """The two runs of the pair whose interval is widest for its precision, if too wide."""
        shortfall = {
            (a, b): ratio_interval(seconds[a], seconds[b]).relative_half_width / precision
            for (a, b), precision in precisions.items()
        }
        pair = max(shortfall, key=shortfall.__getitem__, default=None)
        return list(pair) if pair is not None and shortfall[pair] > 1 else []

    round_index = 0
    extra_started = 0.0
    while True:
        if round_index == warmup + repeats:
            extra_started = time.monotonic()
        if round_index < warmup + repeats:
            chosen = list(runs)
        elif time.monotonic() - extra_started < max_seconds:
            chosen = least_precise()
        else:
            chosen = []
        if not chosen:
            break
        for name in chosen if round_index % 2 == 0 else reversed(chosen):
            elapsed = runs[name]()
            if round_index >= warmup:
                seconds[name].append(elapsed)
        if round_index >= warmup:
            for name in runs:
                if name not in chosen:
                    seconds[name].append(None)
        round_index += 1
    return {name: Timing(tuple(values)) for name, values in seconds.items()}
