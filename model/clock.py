"""Timing a run: wall time, each epoch's speed, and the steady-state speed of the compiled step."""

from __future__ import annotations

import time


class Clock:
    """Wall time since the clock was made, and speed without the steps that traced/compiled."""

    def __init__(self):
        self.started = time.perf_counter()
        self.steady_seconds = 0.0
        self.steady_images = 0
        self.epoch_seconds = 0.0
        self.epoch_images = 0
        self.epoch_steps = 0

    def start_epoch(self) -> None:
        self.epoch_seconds, self.epoch_images, self.epoch_steps = 0.0, 0, 0

    def step(self, function, images, labels) -> None:
        """Run the compiled step `function`; a call that traced it is left out of steady speed."""
        traces = function.experimental_get_tracing_count()
        began = time.perf_counter()
        function(images, labels)
        seconds = time.perf_counter() - began
        count = int(images.shape[0])
        self.epoch_seconds += seconds
        self.epoch_images += count
        self.epoch_steps += 1
        if function.experimental_get_tracing_count() == traces:
            self.steady_seconds += seconds
            self.steady_images += count

    def epoch_rate(self) -> float:
        return self.epoch_images / self.epoch_seconds if self.epoch_seconds else float("nan")

    def epoch_step_time(self) -> float:
        return self.epoch_seconds / self.epoch_steps if self.epoch_steps else float("nan")

    def steady_rate(self) -> float:
        if not self.steady_seconds:
            return self.epoch_rate()
        return self.steady_images / self.steady_seconds

    def wall_time(self) -> float:
        return time.perf_counter() - self.started
