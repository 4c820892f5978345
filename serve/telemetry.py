"""Usage telemetry of the tools towerbench runs: off unless the user opts in.

MLflow 3 (client and UI server), Prefect (SDK and server) and DVC each report usage by default.
towerbench is local and offline by default, so every process it starts inherits their opt-outs;
with `TOWERBENCH_TELEMETRY=on` towerbench sets none of them and each tool keeps its own default.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

OPT_IN = "TOWERBENCH_TELEMETRY"
OFF = {
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "DVC_NO_ANALYTICS": "1",
    # The common opt-out (consoledonottrack.com); Prefect's SDK analytics read only this one.
    "DO_NOT_TRACK": "true",
}


def telemetry_off_unless_opted_in(environment: MutableMapping[str, str] = os.environ) -> None:
    """Set the tools' opt-outs in `environment` (default: this process, and so its children).

    Must run before MLflow is imported: it decides when imported whether to report.
    """
    if environment.get(OPT_IN, "").strip().lower() in ("1", "on", "true", "yes"):
        return
    for name, value in OFF.items():
        environment.setdefault(name, value)
