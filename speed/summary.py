"""From raw medians to the issue's figures: ratios, the JSON summary and the targets table."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from towerbench.speed.results import BenchResults, StepGroup, StepTiming
from towerbench.speed.roofline import matmul_flops
from towerbench.speed.timing import RatioInterval, ratio_interval

# A 2-minute training run: the length orchestration overhead is a share of (issue 5).
REFERENCE_RUN_SECONDS = 120.0


@dataclass(frozen=True)
class TargetRow:
    """One line of the targets table."""

    figure: str
    target: str
    measured: str
    met: bool | None  # None: reported without a target


def _step(steps: list[StepTiming], runner: str, towers: int, batch: int) -> StepTiming:
    for step in steps:
        if (step.runner, step.towers, step.global_batch) == (runner, towers, batch):
            return step
    raise KeyError(f"no {runner} step measured for {towers} towers at batch {batch}")


def step_seconds(steps: list[StepTiming], runner: str, towers: int, batch: int) -> float:
    return _step(steps, runner, towers, batch).step_seconds


def ratio_figure(interval: RatioInterval, scale: float = 1.0) -> dict[str, Any]:
    """A ratio with its 95% interval (None below 2 rounds) and the rounds behind it."""
    known = not math.isnan(interval.low)
    return {
        "ratio": _rounded(scale * interval.ratio),
        "low": _rounded(scale * interval.low) if known else None,
        "high": _rounded(scale * interval.high) if known else None,
        "rounds": interval.rounds,
    }


def step_ratio(
    steps: list[StepTiming], numerator: tuple[str, int, int], denominator: tuple[str, int, int]
) -> RatioInterval:
    return ratio_interval(_step(steps, *numerator).repeats, _step(steps, *denominator).repeats)


def _roofline_fraction(results: BenchResults, settings) -> dict[str, Any]:
    """Training FLOP/s over the fastest matmul's, per round: the product's time over the step's,
    times the step's FLOPs over the product's."""
    rates = results.matmul_flops_per_sec
    size = max(rates, key=rates.__getitem__)
    batch = settings.roofline_batch
    step = _step(results.steps, "towerbench", 1, batch)
    interval = ratio_interval(results.matmul_seconds[size], step.repeats)
    work = results.flops_per_example.training * batch / matmul_flops(int(size))
    return ratio_figure(interval, work)


def _rounded(value: float) -> float:
    return float(f"{value:.4g}")


def speed_summary(results: BenchResults, machine: dict[str, Any], settings) -> dict[str, Any]:
    """The JSON summary of the speed benchmarks (`towerbench bench --json`)."""
    fixed, steps = settings.fixed_global_batch, results.steps
    overhead = {
        str(k): ratio_figure(step_ratio(steps, ("towerbench", k, fixed), ("towerbench", 1, fixed)))
        for k in settings.towers
        if k > 1
    }
    versus_keras = {
        str(k): ratio_figure(
            step_ratio(
                steps,
                ("towerbench", k, k * settings.per_tower_batch),
                ("keras_mirrored", k, k * settings.per_tower_batch),
            )
        )
        for k in settings.keras_towers
    }
    consumption = max(step.images_per_sec for step in steps if step.runner == "towerbench")
    options = {
        option: ratio_figure(
            step_ratio(steps, (f"towerbench:{option}", 1, fixed), ("towerbench", 1, fixed))
        )
        for option in settings.options
    }
    batch = settings.per_tower_batch
    networks = {
        network: ratio_figure(
            step_ratio(
                steps,
                (f"towerbench@{network}", 1, batch),
                (f"keras_mirrored@{network}", 1, batch),
            )
        )
        for network in settings.keras_networks
    }
    return {
        "tower_overhead": overhead,
        "vs_keras_mirrored": versus_keras,
        "vs_keras_mirrored_networks": networks,
        "options_vs_float32": options,
        "roofline_fraction": _roofline_fraction(results, settings),
        "input_pipeline_ratio": _rounded(results.input_pipeline.images_per_sec / consumption),
        "preprocess_60k_seconds": _rounded(results.preprocess.seconds_for_60k),
        "orchestration_overhead": _rounded(
            results.orchestration.overhead_seconds / REFERENCE_RUN_SECONDS
        ),
        "machine": machine,
    }


def roofline(results: StepGroup) -> float:
    """The best measured dense float32 matmul rate (FLOP/s)."""
    return max(results.matmul_flops_per_sec.values())


def achieved_flops(results: BenchResults, settings, runner: str = "towerbench") -> float:
    """FLOP/s of the 1-tower training step at the roofline batch (counted FLOPs / step time)."""
    batch = settings.roofline_batch
    seconds = step_seconds(results.steps, runner, 1, batch)
    return results.flops_per_example.training * batch / seconds


def interval_text(figure: dict[str, Any], percent: bool = False) -> str:
    """The figure as `1.077 [1.021, 1.136]` (or with `(1 round: no interval)`)."""
    shown = (lambda v: f"{v:.1%}") if percent else (lambda v: f"{v:.3f}")
    if figure["low"] is None:
        return f"{shown(figure['ratio'])} (1 round: no interval)"
    return f"{shown(figure['ratio'])} [{shown(figure['low'])}, {shown(figure['high'])}]"


def _judged(figure: dict[str, Any], bound: float, at_most: bool, percent: bool = False) -> tuple:
    """The figure's `interval_text` and whether its whole interval meets `bound`: None when the
    interval straddles it (or is unknown), i.e. too wide to judge."""
    text = interval_text(figure, percent)
    low, high = figure["low"], figure["high"]
    if low is None:
        return text, None
    if (high <= bound) if at_most else (low >= bound):
        return text, True
    if (low > bound) if at_most else (high < bound):
        return text, False
    return f"{text}, too wide to judge", None


def _untargeted_row(name: str, figure: dict[str, Any]) -> TargetRow:
    """A ratio reported with its interval and no target."""
    return TargetRow(name, "—", interval_text(figure), None)


def target_rows(summary: dict[str, Any], settings) -> list[TargetRow]:
    """Every figure with its target (issue 5, on the 2-core CPU) and whether its 95% interval
    meets it; step ratios are shown with that interval."""
    return _step_ratio_rows(summary, settings) + _rate_rows(summary, settings)


def _step_ratio_rows(summary: dict[str, Any], settings) -> list[TargetRow]:
    """The ratios of step times: k towers / 1 tower, ours / Keras' (at k towers, then on the
    other networks), each option / float32."""
    rows = []
    for towers, figure in summary["tower_overhead"].items():
        has_target = int(towers) in settings.judged_towers
        measured, met = _judged(figure, 1.10, at_most=True)
        rows.append(
            TargetRow(
                f"Tower overhead, {towers} towers (step time / 1 tower, global batch "
                f"{settings.fixed_global_batch})",
                "≤ 1.10" if has_target else "—",
                measured,
                met if has_target else None,
            )
        )
    for towers, figure in summary["vs_keras_mirrored"].items():
        batch = int(towers) * settings.per_tower_batch
        rows.append(
            TargetRow(
                f"Our step / Keras fit + MirroredStrategy, {towers} tower(s), global batch {batch}",
                "≤ 1.00",
                *_judged(figure, 1.0, at_most=True),
            )
        )
    for network, figure in summary["vs_keras_mirrored_networks"].items():
        rows.append(
            _untargeted_row(
                f"Our step / Keras fit + MirroredStrategy, `{network}` network, 1 tower, "
                f"global batch {settings.per_tower_batch}",
                figure,
            )
        )
    for option, figure in summary["options_vs_float32"].items():
        rows.append(
            _untargeted_row(
                f"Step time with {option} / float32 (1 tower, global batch "
                f"{settings.fixed_global_batch}; gains are on GPUs, this CPU is a reference)",
                figure,
            )
        )
    return rows


def _rate_rows(summary: dict[str, Any], settings) -> list[TargetRow]:
    """The step's FLOP/s against the roofline, the input pipeline's and preprocessing's rates,
    orchestration's share of a run."""
    ratio = summary["input_pipeline_ratio"]
    seconds = summary["preprocess_60k_seconds"]
    share = summary["orchestration_overhead"]
    return [
        TargetRow(
            f"Training FLOP/s / matmul roofline (1 tower, batch {settings.roofline_batch})",
            "≥ 65%",
            *_judged(summary["roofline_fraction"], 0.65, at_most=False, percent=True),
        ),
        TargetRow(
            "Input pipeline images/s / fastest training consumption",
            "≥ 3×",
            f"{ratio:.2f}×",
            ratio >= 3,
        ),
        TargetRow(
            "60,000 CIFAR-10 images, binary archive -> TFRecords",
            "≤ 30 s",
            f"{seconds:.1f} s",
            seconds <= 30,
        ),
        TargetRow(
            "Prefect flow + MLflow overhead per configuration, share of a 2-minute run",
            "≤ 5%",
            f"{share:.1%}",
            share <= 0.05,
        ),
    ]
