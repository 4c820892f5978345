"""Where runs are tracked: the tracking URI and artifact root made absolute."""

from __future__ import annotations

import os
from pathlib import Path

from towerbench.config.params import TrackingConfig
from towerbench.core.errors import TowerbenchError

PROJECT_DIR = Path(__file__).resolve().parents[1]


def resolve_tracking(tracking: TrackingConfig, base_dir: Path | None = None) -> TrackingConfig:
    """The same settings with an absolute tracking URI and artifact root.

    Order: the given URI, then MLFLOW_TRACKING_URI, then `<base_dir or project>/mlflow.db`. A
    relative SQLite path is taken relative to `base_dir` (default: the current directory), because
    a served deployment runs its flows from another working directory.
    """
    uri = (
        tracking.tracking_uri
        or os.environ.get("MLFLOW_TRACKING_URI")
        or f"sqlite:///{(base_dir or PROJECT_DIR) / 'mlflow.db'}"
    )
    artifact_root = tracking.artifact_root
    if uri.startswith("sqlite:///"):
        database = Path(uri.removeprefix("sqlite:///")).expanduser()
        if not database.is_absolute():
            database = (base_dir or Path.cwd()) / database
        database = database.resolve()
        uri = f"sqlite:///{database}"
        artifact_root = artifact_root or (database.parent / "mlartifacts").as_uri()
    elif "://" not in uri:
        raise TowerbenchError(
            f"tracking_uri: {uri!r} is not a URI (use sqlite:///path/to/mlflow.db or "
            "http://host:port)"
        )
    return tracking.model_copy(update={"tracking_uri": uri, "artifact_root": artifact_root})


def check_store_exists(tracking_uri: str | None) -> None:
    """For reading runs back: a SQLite store that is not there is a one-line error (MLflow would
    create a new, empty one); other stores are left to MLflow."""
    uri = tracking_uri or ""
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file():
        raise TowerbenchError(
            f"tracking URI {uri}: no MLflow store there (the file does not exist); give the "
            "store the sweep was tracked in (--tracking-uri, or tracking.tracking_uri in the "
            "params file)"
        )
