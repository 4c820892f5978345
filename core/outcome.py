"""What became of a configuration's training run: one vocabulary for the training process, the
tracking code, the sweep, a pool's fan-out and the command line."""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from towerbench.core.errors import TowerbenchError
from towerbench.core.metrics import METRICS

if TYPE_CHECKING:
    import pandas  # type: ignore[import-untyped]  # no stubs installed


class Status(StrEnum):
    """A configuration's state, as its MLflow run's `towerbench.status` tag records it."""

    RUNNING = "running"
    COMPLETED = "completed"
    DIVERGED = "diverged"
    FAILED = "failed"

    @property
    def ended(self) -> bool:
        """Trained to its end (a resumed sweep reuses it rather than training it again)."""
        return self in (Status.COMPLETED, Status.DIVERGED)


class Outcome(BaseModel):
    """How one training run ended."""

    model_config = ConfigDict(frozen=True)

    status: Status
    metric: str | None = None  # train.metric as the run resolved it (`accuracy`, `mae`, ...)
    test_metric: float | None = None  # its value on the test split
    test_accuracy: float | None = None  # runs judged by accuracy: test_metric
    unstable: str | None = None  # why a completed run counts as unstable (learning collapsed)
    error: str | None = None  # why it failed, in one line
    worker: str | None = None  # the pool worker that ran it
    images_per_sec: float | None = None
    wall_time: float | None = None
    epochs: float | None = None  # as trained (AdaScale, an early stop or divergence end elsewhere)
    steps: int | None = None  # optimizer updates made
    log: str = Field(default="", exclude=True, repr=False)  # a failed process's stderr

    @classmethod
    def failed(cls, error: str, log: str = "") -> Outcome:
        return cls(status=Status.FAILED, error=error, log=log)

    def judged_by(self) -> tuple[str, float | None]:
        """The metric the run is judged by, as prose names it (`accuracy`, `MAE`), and its test
        value; accuracy for runs recorded before they named their metric."""
        if self.metric is None:
            return "accuracy", self.test_accuracy
        return METRICS[self.metric].label, self.test_metric


class ConfigSummary(Outcome):
    """A configuration of a sweep, its MLflow run and how it ended."""

    run_id: str
    name: str
    towers: int
    workers: int
    seed: int


class SweepResult(BaseModel):
    """What a sweep returns: its MLflow parent run, every configuration, the report."""

    parent_run_id: str
    mlflow_url: str
    configs: list[ConfigSummary]
    verdicts: dict[str, str] = {}  # the report's, by configuration (seeds together)
    report: str

    def to_frame(self) -> pandas.DataFrame:
        """One row per configuration run: its name, towers, workers, seed, status, metric and
        its test value (and test accuracy), speed and MLflow run id."""
        import pandas

        return pandas.DataFrame([config.model_dump(mode="json") for config in self.configs])

    def summary_lines(self) -> list[str]:
        """What a sweep ends with on the terminal and in its flow run's log: each run's status
        and test metric (`test MAE 0.1234`), each configuration's verdict, where the parent run
        and report are."""
        lines = []
        for config in self.configs:
            label, value = config.judged_by()
            shown = f"{value:.4f}" if value is not None else "—"
            error = f"  ({config.error})" if config.error else ""
            lines.append(f"{config.name:<48} {config.status:<9} test {label} {shown}{error}")
        lines += [f"{group}: {verdict}" for group, verdict in self.verdicts.items()]
        return [*lines, f"MLflow parent run: {self.parent_run_id}", f"Report: {self.report}"]

    def nothing_trained(self) -> str | None:
        """Why no configuration completed (each failed or diverged), in one line; else None."""
        if any(config.status == Status.COMPLETED for config in self.configs):
            return None
        diverged = sum(config.status == Status.DIVERGED for config in self.configs)
        failed = len(self.configs) - diverged
        counts = " and ".join(
            f"{count} {what}"
            for count, what in ((diverged, "diverged"), (failed, "failed"))
            if count
        )
        first = next(iter(self.verdicts.items()), None)
        verdict = f"; {first[0]}: {first[1]}" if first else ""
        return (
            f"no configuration completed ({counts} of {len(self.configs)} runs){verdict}; "
            f"report: {self.report}"
        )


class NothingTrained(TowerbenchError):
    """Every configuration of a sweep (or every recipe run of advise) failed or diverged: the
    flow ends Failed and the command with status 1. `result` is what it recorded (None when
    nothing reached a report)."""

    exit_status = 1

    def __init__(self, message: str, result: BaseModel | None = None) -> None:
        super().__init__(message)
        self.result = result

    def __reduce__(self) -> tuple[type[NothingTrained], tuple[str, BaseModel | None]]:
        return type(self), (str(self), self.result)  # Prefect may pickle a flow's exception
