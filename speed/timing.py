"""Median wall times, with competing measurements interleaved so load drift hits them alike.

The CPU here is shared (and on any machine clocks and caches drift), so a ratio of two figures
measured minutes apart mixes the thing measured with whatever else ran meanwhile. Running one
repeat of every candidate per round, round after round, exposes all of them to the same load.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import TypeVar

Key = TypeVar("Key", bound=Hashable)


@dataclass(frozen=True)
class Timing:
    """Seconds of each measured repeat (warm-up excluded)."""

    seconds: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)


def time_once(run: Callable[[], object]) -> float:
    """Seconds taken by `run`, which must block until its work is done."""
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def interleaved(
    runs: Mapping[Key, Callable[[], float]], repeats: int, warmup: int = 1
) -> dict[Key, Timing]:
    """Call every run `warmup + repeats` times, one call of each per round.

    Each run measures itself and returns seconds per unit of work (a step, a product), so it can
    leave set-up it does not want timed out of the figure. Warm-up rounds absorb tracing, graph
    optimisation and allocator growth and are dropped.
    """
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats must be >= 1 and warmup >= 0, got {repeats} and {warmup}")
    seconds: dict[Key, list[float]] = {name: [] for name in runs}
    for round_index in range(warmup + repeats):
        for name, run in runs.items():
            elapsed = run()
            if round_index >= warmup:
                seconds[name].append(elapsed)
    return {name: Timing(tuple(values)) for name, values in seconds.items()}
