"""Test isolation: every tool's home, cache and store points into one temporary directory."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

# Set before Prefect, MLflow, DVC or TensorFlow are imported by any test module.
_SANDBOX = Path(tempfile.mkdtemp(prefix="towerbench-tests-"))
os.environ.update(
    {
        "PREFECT_HOME": str(_SANDBOX / "prefect"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "DVC_SITE_CACHE_DIR": str(_SANDBOX / "dvc-site-cache"),
        "DVC_GLOBAL_CONFIG_DIR": str(_SANDBOX / "dvc-global-config"),
        "DVC_NO_ANALYTICS": "1",
        "MLFLOW_TRACKING_URI": f"sqlite:///{_SANDBOX / 'mlflow.db'}",
        "TF_CPP_MIN_LOG_LEVEL": "2",
    }
)
(_SANDBOX / "prefect").mkdir()  # Prefect's temporary server cannot create its home itself
os.environ.pop("PREFECT_API_URL", None)
os.environ.pop("MLFLOW_RUN_ID", None)


def pytest_sessionfinish(session, exitstatus):  # noqa: ARG001 - pytest hook signature
    shutil.rmtree(_SANDBOX, ignore_errors=True)
