"""Smoke test of the benchmark code (not a benchmark): tiny sizes, real TensorFlow, one process.

The measurements run in a fresh process because they split the CPU into their own logical
devices. The orchestration measurement (a Prefect server and a training process, ~1 minute) is
exercised by `towerbench bench --quick`, not here; its arithmetic is checked below.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import tensorflow as tf

from towerbench.model.networks import build_network
from towerbench.speed.flops import count_step_flops
from towerbench.speed.results import BenchResults, FlowBreakdown, OrchestrationTiming
from towerbench.speed.settings import BenchSettings
from towerbench.speed.summary import speed_summary, target_rows

pytestmark = pytest.mark.slow  # trains, or starts servers or processes

ROOT = Path(__file__).resolve().parents[1]
TINY = dict(
    mode="smoke",
    repeats=2,  # the fewest rounds that give an interval
    warmup=1,
    max_step_seconds=0.0,  # no rounds beyond those
    towers=(1, 2),
    fixed_global_batch=16,
    per_tower_batch=8,
    per_tower_towers=(1, 2),
    keras_towers=(1, 2),
    keras_networks=("tutorial_bn",),
    roofline_batch=8,
    examples_per_repeat=16,
    roofline_sizes=(64, 128),
    pipeline_examples=200,
    preprocess_images_per_file=40,
)
MEASURE = f"""
import sys, tempfile
from pathlib import Path
from pydantic_core import to_json
from towerbench.model.devices import configure_tower_devices
devices = configure_tower_devices(2, "cpu", "cpu")
from towerbench.speed.settings import BenchSettings
from towerbench.speed.suite import (
    count_flops, measure_input_pipeline, measure_layers, measure_preprocessing, measure_steps,
)
from towerbench.config.sections import TrainConfig

settings = BenchSettings(**{TINY!r})
config = TrainConfig()
measured = dict(
    measure_steps(devices, settings, config),
    flops_per_example=count_flops(config),
    layers=measure_layers(devices, settings, config),
)
with tempfile.TemporaryDirectory() as work:
    measured["input_pipeline"] = measure_input_pipeline(Path(work), settings, config)
    measured["preprocess"] = measure_preprocessing(Path(work), settings)
print(to_json(measured).decode())
"""
# Not measured here: only its overhead enters the summary, 6 s of a 2-minute run.
ORCHESTRATION = OrchestrationTiming(
    configurations=3,
    train_examples=512,
    epochs=1,
    direct_seconds=30.0,
    flow_seconds=48.0,
    overhead_seconds=6.0,
    direct_repeats=[30.0],
    flow_repeats=[48.0],
    breakdown=FlowBreakdown(before_first_run=4, in_runs=40, between_runs=1, after_last_run=3),
    process_start_seconds=5.0,
)


@pytest.fixture(scope="module")
def tiny_results() -> BenchResults:
    completed = subprocess.run(
        [sys.executable, "-c", MEASURE], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    measured = json.loads(completed.stdout.strip().splitlines()[-1])
    return BenchResults.model_validate({**measured, "orchestration": ORCHESTRATION})


def test_every_configuration_is_measured(tiny_results: BenchResults) -> None:
    measured = {(s.runner, s.towers, s.global_batch) for s in tiny_results.steps}
    assert measured == {
        ("towerbench", 1, 16),
        ("towerbench", 2, 16),
        ("towerbench", 1, 8),
        ("keras_mirrored", 1, 8),
        ("keras_mirrored", 2, 16),
        ("towerbench@tutorial_bn", 1, 8),
        ("keras_mirrored@tutorial_bn", 1, 8),
        ("towerbench:xla", 1, 16),
        ("towerbench:mixed_float16", 1, 16),
        ("towerbench:mixed_bfloat16", 1, 16),
    }
    assert all(step.step_seconds > 0 for step in tiny_results.steps)
    layers = tiny_results.layers.seconds
    assert list(layers)[:3] == ["conv1", "pool1", "norm1"] and "softmax_linear" in layers
    assert all(seconds > 0 for seconds in layers.values())
    assert set(tiny_results.matmul_flops_per_sec) == {"64", "128"}
    assert tiny_results.input_pipeline.images_per_sec > 0
    preprocess = tiny_results.preprocess
    assert preprocess.images == 6 * 40 and preprocess.extrapolated
    assert preprocess.seconds_for_60k == pytest.approx(preprocess.seconds * 60_000 / 240)


def test_summary_has_the_issue_shape_and_correct_ratios(tiny_results: BenchResults) -> None:
    settings = BenchSettings(**TINY)
    summary = speed_summary(tiny_results, {"cpu": "test"}, settings)
    assert list(summary) == [
        "tower_overhead",
        "vs_keras_mirrored",
        "vs_keras_mirrored_networks",
        "options_vs_float32",
        "roofline_fraction",
        "input_pipeline_ratio",
        "preprocess_60k_seconds",
        "orchestration_overhead",
        "machine",
    ]
    assert set(summary["tower_overhead"]) == {"2"}
    assert set(summary["vs_keras_mirrored"]) == {"1", "2"}
    assert set(summary["vs_keras_mirrored_networks"]) == {"tutorial_bn"}
    assert set(summary["options_vs_float32"]) == {"xla", "mixed_float16", "mixed_bfloat16"}
    rounds = {(s.runner, s.towers, s.global_batch): s.repeats for s in tiny_results.steps}
    per_round = [
        two / one
        for two, one in zip(
            rounds[("towerbench", 2, 16)], rounds[("towerbench", 1, 16)], strict=True
        )
    ]
    overhead = summary["tower_overhead"]["2"]
    assert overhead["rounds"] == 2
    assert overhead["ratio"] == pytest.approx(math.sqrt(per_round[0] * per_round[1]), rel=1e-3)
    assert overhead["low"] <= overhead["ratio"] <= overhead["high"]
    assert summary["orchestration_overhead"] == pytest.approx(0.05)  # 6 s of a 2-minute run
    assert [row.met for row in target_rows(summary, settings)][-1] is True


def test_flop_count_agrees_with_tensorflow_profiler_on_the_forward_pass() -> None:
    network = build_network("tutorial", (24, 24, 3), 10, seed=0)
    counted = count_step_flops(lambda images: network.model(images, training=True), (24, 24, 3))

    forward = tf.function(lambda images: network.model(images, training=True))
    graph = forward.get_concrete_function(tf.TensorSpec([1, 24, 24, 3], tf.float32)).graph
    options = tf.compat.v1.profiler.ProfileOptionBuilder.float_operation()
    options["output"] = "none"
    profile = tf.compat.v1.profiler.profile(graph=graph, options=options)
    operations = {node.name: node.total_float_ops for node in profile.children}
    kernels = [op for op in graph.get_operations() if op.type in ("Conv2D", "MatMul")]
    layers = [op for op in kernels if "/norm" not in op.name]
    assert len(kernels) == len(layers) + 2  # each LRN's window sums, not counted
    assert counted.forward == sum(operations[op.name] for op in layers)
    # Backward: weight gradients of every layer, input gradients of all but the first conv.
    first_conv = 2 * 24 * 24 * 5 * 5 * 3 * 64
    assert counted.training == 3 * counted.forward - first_conv


def test_the_flow_breakdown_adds_up_from_the_mlflow_run_times(tmp_path: Path) -> None:
    from mlflow import MlflowClient

    from towerbench.config.params import TrackingConfig
    from towerbench.overhead.orchestration import flow_breakdown

    tracking = TrackingConfig(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    client = MlflowClient(tracking.tracking_uri)
    experiment = client.create_experiment("breakdown")
    start = 1_800_000_000.0  # seconds; MLflow keeps milliseconds
    parent = client.create_run(experiment, start_time=int(start * 1e3)).info.run_id
    for begin, end in [(2.0, 5.0), (5.5, 9.0), (9.25, 12.0)]:
        child = client.create_run(
            experiment,
            start_time=int((start + begin) * 1e3),
            tags={"mlflow.parentRunId": parent},
        )
        client.set_terminated(child.info.run_id, end_time=int((start + end) * 1e3))
    flow = {"started": start + 0.5, "ended": start + 13.0, "parent": parent}
    parts = flow_breakdown(tracking, flow).model_dump()
    assert parts == pytest.approx(
        {"before_first_run": 1.5, "in_runs": 9.25, "between_runs": 0.75, "after_last_run": 1.0}
    )
    assert sum(parts.values()) == pytest.approx(flow["ended"] - flow["started"])
