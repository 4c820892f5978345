"""From raw medians to the issue's figures: ratios, the JSON summary and the targets table."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# A 2-minute training run: the length orchestration overhead is a share of (issue 5).
REFERENCE_RUN_SECONDS = 120.0


@dataclass(frozen=True)
class TargetRow:
    """One line of the targets table."""

    figure: str
    target: str
    measured: str
    met: bool | None  # None: reported without a target


def _step_seconds(results: dict[str, Any], runner: str, towers: int, batch: int) -> float:
    for step in results["steps"]:
        if (step["runner"], step["towers"], step["global_batch"]) == (runner, towers, batch):
            return step["step_seconds"]
    raise KeyError(f"no {runner} step measured for {towers} towers at batch {batch}")


def _rounded(value: float) -> float:
    return float(f"{value:.4g}")


def speed_summary(
    results: dict[str, Any],
    orchestration: dict[str, Any],
    machine: dict[str, Any],
    settings,
) -> dict[str, Any]:
    """The JSON summary of the speed benchmarks (`towerbench bench --json`)."""
    fixed = settings.fixed_global_batch
    single = _step_seconds(results, "towerbench", 1, fixed)
    overhead = {
        str(k): _rounded(_step_seconds(results, "towerbench", k, fixed) / single)
        for k in settings.towers
        if k > 1
    }
    versus_keras = {
        str(k): _rounded(
            _step_seconds(results, "towerbench", k, k * settings.per_tower_batch)
            / _step_seconds(results, "keras_mirrored", k, k * settings.per_tower_batch)
        )
        for k in settings.keras_towers
    }
    consumption = max(
        step["images_per_sec"] for step in results["steps"] if step["runner"] == "towerbench"
    )
    return {
        "tower_overhead": overhead,
        "vs_keras_mirrored": versus_keras,
        "roofline_fraction": _rounded(achieved_flops(results, settings) / roofline(results)),
        "input_pipeline_ratio": _rounded(results["input_pipeline"]["images_per_sec"] / consumption),
        "preprocess_60k_seconds": _rounded(results["preprocess"]["seconds_for_60k"]),
        "orchestration_overhead": _rounded(
            orchestration["overhead_seconds"] / REFERENCE_RUN_SECONDS
        ),
        "machine": machine,
    }


def roofline(results: dict[str, Any]) -> float:
    """The best measured dense float32 matmul rate (FLOP/s)."""
    return max(results["matmul_flops_per_sec"].values())


def achieved_flops(results: dict[str, Any], settings, runner: str = "towerbench") -> float:
    """FLOP/s of the 1-tower training step at the roofline batch (counted FLOPs / step time)."""
    batch = settings.roofline_batch
    seconds = _step_seconds(results, runner, 1, batch)
    return results["flops_per_example"]["training"] * batch / seconds


def target_rows(summary: dict[str, Any], settings) -> list[TargetRow]:
    """Every figure with its target (issue 5, on the 2-core CPU) and whether it was met."""
    rows = []
    for towers, ratio in summary["tower_overhead"].items():
        has_target = towers in ("2", "4")
        rows.append(
            TargetRow(
                f"Tower overhead, {towers} towers (step time / 1 tower, global batch "
                f"{settings.fixed_global_batch})",
                "≤ 1.10" if has_target else "—",
                f"{ratio:.3f}",
                ratio <= 1.10 if has_target else None,
            )
        )
    for towers, ratio in summary["vs_keras_mirrored"].items():
        batch = int(towers) * settings.per_tower_batch
        rows.append(
            TargetRow(
                f"Our step / Keras fit + MirroredStrategy, {towers} tower(s), global batch {batch}",
                "≤ 1.00",
                f"{ratio:.3f}",
                ratio <= 1.0,
            )
        )
    fraction = summary["roofline_fraction"]
    rows.append(
        TargetRow(
            f"Training FLOP/s / matmul roofline (1 tower, batch {settings.roofline_batch})",
            "≥ 65%",
            f"{fraction:.1%}",
            fraction >= 0.65,
        )
    )
    ratio = summary["input_pipeline_ratio"]
    rows.append(
        TargetRow(
            "Input pipeline images/s / fastest training consumption",
            "≥ 3×",
            f"{ratio:.2f}×",
            ratio >= 3,
        )
    )
    seconds = summary["preprocess_60k_seconds"]
    rows.append(
        TargetRow(
            "60,000 CIFAR-10 images, binary archive -> TFRecords",
            "≤ 30 s",
            f"{seconds:.1f} s",
            seconds <= 30,
        )
    )
    share = summary["orchestration_overhead"]
    rows.append(
        TargetRow(
            "Prefect flow + MLflow overhead, share of a 2-minute run",
            "≤ 5%",
            f"{share:.1%}",
            share <= 0.05,
        )
    )
    return rows
