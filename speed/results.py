"""What `towerbench bench` measures, as typed records: the suite (speed/suite.py) and the
orchestration benchmark (overhead/) make them, the summary and the report read them."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True)


class StepTiming(_Record):
    """One timed step: which runner, how many towers, which global batch."""

    runner: str  # towerbench[:option][@network] or keras_mirrored[@network]
    towers: int
    global_batch: int
    # Its median, images/s at that median, and every round's seconds (None: a round it sat out).
    step_seconds: float
    images_per_sec: float
    repeats: list[float | None]


class StepGroup(_Record):
    """The step group, timed round-robin: every step, and the matmul roofline beside them."""

    steps: list[StepTiming]
    # Per matrix size (as text, a JSON key): the median's FLOP/s, and every round's seconds.
    matmul_flops_per_sec: dict[str, float]
    matmul_seconds: dict[str, list[float | None]]


class StepFlops(_Record):
    """FLOPs per example of one forward pass and of one training step (forward + backward),
    counted by speed/flops.py."""

    forward: int
    training: int


class LayerTimes(_Record):
    """Median seconds of each layer's forward + backward pass alone, at one batch."""

    batch: int
    seconds: dict[str, float]


class PipelineRate(_Record):
    """The input pipeline: one epoch of `examples` TFRecords at one batch."""

    examples: int
    global_batch: int
    images_per_sec: float


class PreprocessRate(_Record):
    """Converting a CIFAR-10 binary archive of `images` to TFRecords, and the figure for the
    official 60,000 (extrapolated when fewer were converted)."""

    images: int
    seconds: float
    images_per_sec: float
    seconds_for_60k: float
    extrapolated: bool


class FlowBreakdown(_Record):
    """Where a flow's seconds went, from its MLflow runs' start and end times."""

    before_first_run: float  # flow and parent run set-up
    in_runs: float  # training, live logging, evaluation artifacts
    between_runs: float  # a run ends, the next is opened
    after_last_run: float  # report, parent run closed


class OrchestrationTiming(_Record):
    """The same configurations trained by direct train() calls and by the `sweep` flow."""

    # What both sides train.
    configurations: int
    train_examples: int
    epochs: float
    # Median seconds of each side, every round's, and the difference per configuration.
    direct_seconds: float
    flow_seconds: float
    overhead_seconds: float
    direct_repeats: list[float | None]
    flow_repeats: list[float | None]
    # The flow's last repeat in parts; a training process's start-up (paid once per command).
    breakdown: FlowBreakdown
    process_start_seconds: float


class BenchResults(StepGroup):
    """Every measurement of one `towerbench bench` run on the built-in network."""

    flops_per_example: StepFlops
    layers: LayerTimes
    input_pipeline: PipelineRate
    preprocess: PreprocessRate
    orchestration: OrchestrationTiming
