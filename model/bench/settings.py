"""How much each benchmark measures: the full run behind docs/benchmarks.md, or a quick look."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BenchSettings:
    """Sizes and repeat counts; every figure is a median of `repeats` after `warmup` rounds."""

    mode: str
    repeats: int = 5
    warmup: int = 1
    towers: tuple[int, ...] = (1, 2, 4, 8)
    fixed_global_batch: int = 512  # tower overhead: same work split k ways
    per_tower_batch: int = 128  # weak scaling: work grows with k (as when adding GPUs)
    keras_towers: tuple[int, ...] = (1, 4)  # compared at the per-tower batch
    roofline_batch: int = 128  # the 1-tower step whose FLOP/s is set against the roofline
    examples_per_repeat: int = 1024  # a step repeat runs max(2, this / global batch) steps
    roofline_sizes: tuple[int, ...] = (2048, 4096)
    pipeline_examples: int = 10_000  # TFRecords the input pipeline reads per repeat (one epoch)
    preprocess_images_per_file: int = 10_000  # x 6 files: the official archive's 60,000
    orchestration_train_examples: int = 2_048
    orchestration_epochs: float = 2

    @classmethod
    def full(cls) -> BenchSettings:
        return cls(mode="full")

    @classmethod
    def quick(cls) -> BenchSettings:
        """The same keys in under 3 minutes: fewer steps and images, extrapolated where noted."""
        return cls(
            mode="quick",
            examples_per_repeat=512,
            pipeline_examples=3_000,
            preprocess_images_per_file=2_000,
            orchestration_train_examples=512,
            orchestration_epochs=1,
        )

    def steps_per_repeat(self, global_batch: int) -> int:
        return max(2, self.examples_per_repeat // global_batch)

    @property
    def max_towers(self) -> int:
        return max(self.towers)
