"""Flow run names a runs list can tell apart: what each run compares, not Prefect's random names.

Prefect calls these when a flow run starts (`flow_run_name=`); they read the run's parameters.
"""

from __future__ import annotations

from datetime import date
from typing import Any

from prefect.runtime import flow_run

from towerbench.config.model_ref import model_label


def _listed(name: str, values: list[Any]) -> str:
    return f"{name}={','.join(str(value) for value in values)}"


def _field(section: Any, name: str, default: Any = None) -> Any:
    """A field of a parameter: the model a local call passed, or its JSON from a deployment."""
    if isinstance(section, dict):
        return section.get(name, default)
    return getattr(section, name, default)


def sweep_run_name() -> str:
    """`advise sweep digits small_resnet:build towers=1,4 lr=sqrt seeds=0,1,2`."""
    parameters = flow_run.parameters
    train, grid = parameters["train"], parameters["sweep"]
    kind = parameters.get("kind", "sweep")
    lead = "sweep" if kind == "sweep" else f"{kind} sweep"
    axes = [_listed("towers", _field(grid, "towers", []))]
    if _field(grid, "workers", [1]) != [1]:
        axes.append(_listed("workers", _field(grid, "workers")))
    axes += [
        _listed("lr", _field(grid, "lr_scaling", [])),
        _listed("seeds", _field(grid, "seeds", [])),
    ]
    model = model_label(_field(train, "model", "tutorial"))
    return f"{lead} {_field(train, 'dataset')} {model} {' '.join(axes)}"


def dated_run_name(flow: str) -> str:
    """`nightly 2026-12-03`: the deployment's runs, one a day, by their date."""
    return f"{flow} {date.today().isoformat()}"


def advise_run_name() -> str:
    """`advise towers=4 seeds=3` (`advise towers=4` without verification; the model or dataset
    too when the form named one)."""
    parameters = flow_run.parameters
    advice = parameters["advice"]
    chosen = [parameters.get(name) for name in ("model", "dataset")]
    named = " ".join(str(value) for value in chosen if value)
    asked = f"towers={_field(advice, 'towers')}"
    if _field(advice, "verify", True):  # the seeds of the verification sweep
        asked += f" seeds={_field(advice, 'seeds')}"
    return " ".join(part for part in ("advise", named, asked) if part)
