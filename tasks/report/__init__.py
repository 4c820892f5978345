"""The sweep report: read the runs from MLflow, compare them, render, publish."""

from towerbench.tasks.report.publish import (
    make_report,
    publish_artifact,
    read_verdicts,
    write_report,
)

__all__ = ["make_report", "publish_artifact", "read_verdicts", "write_report"]
