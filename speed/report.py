"""docs/benchmarks.md from one `towerbench bench` run: machine, targets table, the raw figures."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from towerbench.core.files import write_atomically
from towerbench.core.markdown import markdown_table
from towerbench.speed.results import BenchResults, OrchestrationTiming
from towerbench.speed.settings import BenchSettings
from towerbench.speed.summary import (
    REFERENCE_RUN_SECONDS,
    achieved_flops,
    roofline,
    step_seconds,
    target_rows,
)

MET = {True: "yes", False: "**no**", None: "—"}


def render_markdown(
    summary: dict[str, Any], results: BenchResults, settings: BenchSettings, seconds: float
) -> str:
    """The report as markdown."""
    lines = [
        *_method_section(settings, seconds),
        "## Machine",
        "",
        markdown_table(
            ["", ""], [[key, f"`{value}`"] for key, value in summary["machine"].items()]
        ),
        "",
        f"Optimizer in every timed step: `{summary['optimizer']}` (the params file's `train:`).",
        "",
        "## Targets",
        "",
        markdown_table(
            ["Figure", "Target", "Measured", "Met"],
            [
                [row.figure, row.target, row.measured, MET[row.met]]
                for row in target_rows(summary, settings)
            ],
        ),
        "",
        *_steps_section(results),
        *_flops_section(results, settings),
        *_layers_section(results, settings),
        *_data_sections(results, summary),
        "## JSON summary",
        "",
        "```json",
        json.dumps(summary),
        "```",
        "",
    ]
    return "\n".join(lines)


def _method_section(settings: BenchSettings, seconds: float) -> list[str]:
    """The title, and how the figures were measured and judged."""
    return [
        "# Benchmarks",
        "",
        f"Written by `towerbench bench` ({settings.mode} run, {time.strftime('%Y-%m-%d %H:%M')}, "
        f"{seconds / 60:.1f} minutes). The candidates of each comparison are timed round-robin "
        "in the same run, so a ratio sees one machine load; a step ratio is the geometric mean "
        "of the per-round ratios with its 95% interval [low, high], and rounds went on (at "
        f"least {settings.repeats} after {settings.warmup} warm-up; then, for the ratios with "
        "a target and the other networks against Keras, a round of the one furthest from its "
        "precision at a time, its two candidates back to back) until every one of those was "
        f"within ±{settings.precision:.0%} (±{settings.peer_precision:.0%} against Keras) or "
        f"those extra rounds had taken {settings.max_step_seconds:.0f} s. A "
        "target is met when the whole interval meets it; an interval that straddles it is too "
        "wide to judge. Other figures are medians (orchestration: "
        f"{settings.orchestration_repeats} repeats after {settings.orchestration_warmup}). "
        "Regenerate with `make bench`.",
        "",
    ]


def _steps_section(results: BenchResults) -> list[str]:
    """Every timed step's median, by runner, batch and towers."""
    steps = sorted(results.steps, key=lambda s: (s.runner, s.global_batch, s.towers))
    rows = [
        [
            step.runner,
            str(step.towers),
            str(step.global_batch),
            f"{step.step_seconds * 1e3:.1f}",
            f"{step.images_per_sec:.0f}",
        ]
        for step in steps
    ]
    return [
        "## Training step (`tutorial` network, fixed in-memory batch)",
        "",
        markdown_table(["Runner", "Towers", "Global batch", "Step (ms)", "Images/s"], rows),
        "",
    ]


def _flops_section(results: BenchResults, settings: BenchSettings) -> list[str]:
    flops = results.flops_per_example
    best = roofline(results)
    rates = ", ".join(
        f"{size}²: {rate / 1e9:.1f} GFLOP/s" for size, rate in results.matmul_flops_per_sec.items()
    )
    ours = achieved_flops(results, settings)
    keras = achieved_flops(results, settings, "keras_mirrored")
    return [
        "## FLOP/s against the matmul roofline",
        "",
        f"- Dense float32 matmul (tf.matmul, same run): {rates}; roofline = {best / 1e9:.1f} "
        "GFLOP/s.",
        f"- FLOPs per example, counted analytically from the traced graph's convolutions and "
        f"matrix products (2 per multiply-add): forward {flops.forward / 1e6:.2f} M, training "
        f"step {flops.training / 1e6:.2f} M (forward + weight gradients + input gradients, "
        "none for the image batch; element-wise ops not counted).",
        f"- 1 tower, batch {settings.roofline_batch}: towerbench {ours / 1e9:.1f} GFLOP/s "
        f"({ours / best:.1%}), Keras fit + MirroredStrategy {keras / 1e9:.1f} GFLOP/s "
        f"({keras / best:.1%}).",
        "",
    ]


def _layers_section(results: BenchResults, settings: BenchSettings) -> list[str]:
    layers = results.layers
    step = step_seconds(results.steps, "towerbench", 1, layers.batch)
    keras = step_seconds(results.steps, "keras_mirrored", 1, layers.batch)
    total = sum(layers.seconds.values())
    rows = [
        [f"`{name}`", f"{seconds * 1e3:.1f}", f"{seconds / total:.0%}"]
        for name, seconds in layers.seconds.items()
    ]
    return [
        f"## Where the step goes (`tutorial`, 1 tower, batch {layers.batch})",
        "",
        "Each layer's forward and backward pass timed on its own (speed/layers.py): alone they "
        f"add up to {total * 1e3:.1f} ms, against our whole step's {step * 1e3:.1f} ms (Keras fit "
        f"+ MirroredStrategy: {keras * 1e3:.1f} ms). Read the shares, not the sum: a layer alone "
        "pays its own call and memory traffic, which a step shares (not measured separately). "
        "Both runners execute these same layer kernels, so the layers bound both alike; only the "
        "loss, the optimizer, the moving average and the metrics differ between them.",
        "",
        markdown_table(["Layer", "Forward + backward alone (ms)", "Share of the layers"], rows),
        "",
    ]


def _data_sections(results: BenchResults, summary: dict[str, Any]) -> list[str]:
    pipeline = results.input_pipeline
    preprocess = results.preprocess
    orchestration = results.orchestration
    extrapolated = " (extrapolated linearly)" if preprocess.extrapolated else ""
    return [
        "## Data and orchestration",
        "",
        f"- Input pipeline (TFRecords -> 24x24 crop, flip, brightness, contrast, "
        f"standardisation, batch {pipeline.global_batch}, one epoch of "
        f"{pipeline.examples:,} examples incl. the shuffle buffer): "
        f"{pipeline.images_per_sec:.0f} images/s = {summary['input_pipeline_ratio']:.2f}× the "
        "fastest training step measured above.",
        f"- Preprocessing (official-format cifar-10-binary.tar.gz, random pixels, "
        f"{preprocess.images:,} images): {preprocess.seconds:.2f} s, "
        f"{preprocess.images_per_sec:.0f} images/s; 60,000 images: "
        f"{preprocess.seconds_for_60k:.1f} s{extrapolated}.",
        f"- Orchestration ({orchestration.configurations} configurations: tutorial, 1 tower, "
        f"seeds 0-{orchestration.configurations - 1}, {orchestration.train_examples:,} "
        f"examples, {orchestration.epochs:g} epoch(s)): train() called directly for each "
        f"{orchestration.direct_seconds:.1f} s, the `sweep` flow with MLflow tracking "
        f"{orchestration.flow_seconds:.1f} s; overhead {orchestration.overhead_seconds:.1f} s"
        f" per configuration = {summary['orchestration_overhead']:.1%} of a "
        f"{REFERENCE_RUN_SECONDS / 60:.0f}-minute run. Starting a training process (Python + "
        f"TensorFlow + MLflow imports) takes {orchestration.process_start_seconds:.1f} s: a "
        "sweep command pays it once, in its fork server, started beside Prefect's start-up "
        "(outside this figure, like Prefect's), and forks each configuration's process from it.",
        *_breakdown_lines(orchestration),
        "",
    ]


def _breakdown_lines(orchestration: OrchestrationTiming) -> list[str]:
    """Where the flow's seconds went (its last repeat), against the direct calls."""
    parts = orchestration.breakdown
    count = orchestration.configurations
    return [
        "- Where the flow's seconds go (last repeat, from its MLflow runs' start and end times): "
        f"{parts.before_first_run:.1f} s before the first configuration's run starts (flow "
        f"and parent run set-up); {parts.in_runs:.1f} s in the {count} runs (training, live "
        "logging, evaluation artifacts: "
        f"{orchestration.direct_seconds:.1f} s when train() is called directly); "
        f"{parts.between_runs:.1f} s between them; {parts.after_last_run:.1f} s after "
        "the last (report, parent run closed).",
    ]


def write_markdown(path: Path, text: str) -> None:
    """Write `text` to `path` atomically (a temporary file renamed into place)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, text.encode())
