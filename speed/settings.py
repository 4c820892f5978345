"""How much each benchmark measures: the full run behind docs/benchmarks.md, or a quick look."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BenchSettings:
    """Sizes and repeat counts. Every figure is a median of at least `repeats` rounds after
    `warmup`; the step group adds rounds until each judged ratio's 95% interval is within
    ±`precision` (±`peer_precision` against the Keras peer), or those extra rounds have taken
    `max_step_seconds`."""

    mode: str
    repeats: int = 5
    warmup: int = 1
    precision: float = 0.03
    # "Never slower than Keras" is decided by a few percent, which ±3% cannot resolve.
    peer_precision: float = 0.02
    max_step_seconds: float = 900.0
    towers: tuple[int, ...] = (1, 2, 4, 8)
    judged_towers: tuple[int, ...] = (2, 4)  # tower counts whose overhead has a target
    fixed_global_batch: int = 512  # tower overhead: same work split k ways
    per_tower_batch: int = 128  # weak scaling: work grows with k (as when adding GPUs)
    per_tower_towers: tuple[int, ...] = (1, 2, 4, 8)  # tower counts timed at the per-tower batch
    keras_towers: tuple[int, ...] = (1, 4)  # compared at the per-tower batch
    # The other networks also set against the Keras peer (1 tower, the per-tower batch).
    keras_networks: tuple[str, ...] = ("tutorial_bn", "resnet20")
    roofline_batch: int = 128  # the 1-tower step whose FLOP/s is set against the roofline
    # Training options timed against float32 (1 tower, the fixed global batch): no target here.
    options: tuple[str, ...] = ("xla", "mixed_float16", "mixed_bfloat16")
    examples_per_repeat: int = 1024  # a step repeat runs max(1, this / global batch) steps
    roofline_sizes: tuple[int, ...] = (2048, 4096)
    pipeline_examples: int = 10_000  # TFRecords the input pipeline reads per repeat (one epoch)
    preprocess_images_per_file: int = 10_000  # x 6 files: the official archive's 60,000
    orchestration_train_examples: int = 2_048
    orchestration_epochs: float = 2
    # A sweep of this many configurations (seeds) against as many direct train() calls: from the
    # second one on, the flow starts each training process while the previous one trains.
    orchestration_configurations: int = 3
    orchestration_repeats: int = 5  # each repeat trains each configuration twice
    orchestration_warmup: int = 1  # rounds after Prefect's server is up, before timing

    @classmethod
    def full(cls) -> BenchSettings:
        return cls(mode="full")

    @classmethod
    def quick(cls) -> BenchSettings:
        """The same keys in 4-6 minutes: fewer repeats, rounds and images (indicative only;
        preprocessing is extrapolated to 60,000 images). A repeat keeps the full run's steps:
        shorter ones made the Keras ratios' rounds noisier than the rounds saved."""
        return cls(
            mode="quick",
            repeats=3,
            max_step_seconds=150.0,
            per_tower_towers=(1, 4),  # only what the Keras comparison needs
            keras_networks=(),
            pipeline_examples=3_000,
            preprocess_images_per_file=2_000,
            orchestration_train_examples=512,
            orchestration_epochs=1,
            orchestration_repeats=2,
            orchestration_warmup=0,
        )

    def steps_per_repeat(self, global_batch: int) -> int:
        return max(1, self.examples_per_repeat // global_batch)

    @property
    def max_towers(self) -> int:
        return max(self.towers)
