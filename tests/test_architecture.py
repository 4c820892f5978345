"""Imports go one way, flows -> tasks -> speed -> ingest -> model, the three lower floors stay
free of Prefect, MLflow and DVC, and the orchestrating processes of TensorFlow and scikit-learn."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from flows.cli import COMMAND_MODULES

ROOT = Path(__file__).resolve().parents[1]
ORCHESTRATION = {"prefect", "mlflow", "dvc"}


def imported_top_level_modules(package: str) -> dict[str, set[str]]:
    """Top-level module names imported by each file of `package`."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module.split(".")[0])
        found[str(path.relative_to(ROOT))] = names
    return found


def loaded_alongside(modules: list[str], watched: set[str]) -> list[str]:
    """Which of `watched` a fresh interpreter has loaded once it has imported `modules`."""
    script = (
        "import importlib, sys\n"
        f"for name in {modules!r}: importlib.import_module(name)\n"
        f"print(sorted(m for m in {sorted(watched)!r} if m in sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return ast.literal_eval(result.stdout.strip().splitlines()[-1])


FLOORS = ("model", "ingest", "speed", "tasks", "flows")  # each imports only the ones before it
PURE = ("model", "ingest", "speed")  # no orchestration library


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [
        (package, set(FLOORS[floor + 1 :]) | (ORCHESTRATION if package in PURE else set()))
        for floor, package in enumerate(FLOORS)
    ],
)
def test_imports_point_one_way(package: str, forbidden: set[str]) -> None:
    offenders = {
        file: sorted(names & forbidden)
        for file, names in imported_top_level_modules(package).items()
        if names & forbidden
    }
    assert not offenders, f"{package}/ must not import {sorted(forbidden)}: {offenders}"


def test_every_pure_module_imports_without_orchestration_libraries() -> None:
    modules = [
        ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for package in PURE
        for path in sorted((ROOT / package).rglob("*.py"))
        if path.name != "__init__.py"
    ]
    assert loaded_alongside(modules, ORCHESTRATION) == []


def test_orchestrating_processes_import_neither_tensorflow_nor_scikit_learn() -> None:
    """The commands and a pool's flow runs leave both to the processes that use them (about 7 s
    and 2 s of CPU per process on 2 slow cores)."""
    modules = [*COMMAND_MODULES, "flows.temporary_server", "flows.sweep", "flows.pipeline"]
    modules += ["flows.fan_out", "flows.config_run"]
    assert loaded_alongside(modules, {"sklearn", "tensorflow"}) == []
