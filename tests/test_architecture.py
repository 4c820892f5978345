"""The house's floors: each package imports only the packages below it, no package's modules
import each other in a circle, the lower floors stay free of Prefect, MLflow and DVC, and the
orchestrating processes free of TensorFlow and scikit-learn."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from towerbench.cli.main import COMMAND_MODULES

ROOT = Path(__file__).resolve().parents[1]
ORCHESTRATION = {"prefect", "mlflow", "dvc"}
# From the ground up; each package imports only the ones before it (see docs/architecture.md).
FLOORS = (
    "core",
    "config",
    "model",
    "ingest",
    "speed",
    "tasks",
    "flows",
    "serve",
    "overhead",
    "cli",
    "api",  # beside cli/: towerbench from Python; neither imports the other
)
PURE = ("core", "config", "model", "ingest", "speed")  # no orchestration library


def towerbench_imports(path: Path) -> set[str]:
    """The towerbench modules `path` imports (function-local imports included), as dotted names
    without the `towerbench.` prefix; `from package import name` counts as both."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        found.update(
            name.removeprefix("towerbench.") for name in names if name.startswith("towerbench.")
        )
    return found


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


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


@pytest.mark.parametrize(
    ("package", "higher"),
    [(package, set(FLOORS[floor + 1 :])) for floor, package in enumerate(FLOORS)],
)
def test_imports_point_down(package: str, higher: set[str]) -> None:
    floors = {
        module_name(path): {name.split(".")[0] for name in towerbench_imports(path)}
        for path in sorted((ROOT / package).rglob("*.py"))
    }
    offenders = {module: sorted(used & higher) for module, used in floors.items() if used & higher}
    assert not offenders, f"{package}/ imports a higher floor: {offenders}"


def test_api_stands_beside_cli() -> None:
    """The Python functions call what the commands call, never the commands' own code."""
    offenders = [
        module_name(path)
        for path in sorted((ROOT / "api").rglob("*.py"))
        if any(name.split(".")[0] == "cli" for name in towerbench_imports(path))
    ]
    assert not offenders, f"api/ imports cli/: {offenders}"


@pytest.mark.parametrize("package", PURE)
def test_lower_floors_import_no_orchestration_library(package: str) -> None:
    offenders = {
        file: sorted(names & ORCHESTRATION)
        for file, names in imported_top_level_modules(package).items()
        if names & ORCHESTRATION
    }
    assert not offenders, f"{package}/ must not import {sorted(ORCHESTRATION)}: {offenders}"


def import_cycles(package: str) -> list[list[str]]:
    """Circles of imports among the modules of `package` (each found once, from its smallest
    module name)."""
    modules = {module_name(path): path for path in sorted((ROOT / package).rglob("*.py"))}
    edges = {
        name: sorted(
            imported
            for imported in towerbench_imports(path)
            if imported in modules and imported != name
        )
        for name, path in modules.items()
    }
    cycles: list[list[str]] = []

    def visit(start: str, node: str, path: list[str]) -> None:
        for following in edges[node]:
            if following == start:
                cycles.append([*path, start])
            elif following > start and following not in path:
                visit(start, following, [*path, following])

    for start in sorted(modules):
        visit(start, start, [start])
    return cycles


@pytest.mark.parametrize("package", FLOORS)
def test_no_circle_of_imports_inside_a_package(package: str) -> None:
    cycles = import_cycles(package)
    assert not cycles, f"{package}/ has circles of imports: " + "; ".join(
        " -> ".join(cycle) for cycle in cycles
    )


@pytest.mark.slow
def test_the_installed_package_is_towerbench_alone(tmp_path) -> None:
    """The wheel holds one top-level package, `towerbench`, with every module of every floor."""
    source = tmp_path / "source"  # setuptools writes build/ beside the sources
    for package in (*FLOORS, "towerbench"):
        shutil.copytree(
            ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(source),
        ],
        check=True,
    )
    (wheel,) = tmp_path.glob("towerbench-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    top_level = {name.split("/")[0] for name in names}
    assert top_level == {"towerbench", "-".join(wheel.name.split("-")[:2]) + ".dist-info"}
    expected = {
        "towerbench/" + str(path.relative_to(ROOT))
        for package in FLOORS
        for path in (ROOT / package).rglob("*.py")
    }
    expected.add("towerbench/__init__.py")
    assert expected <= set(names), sorted(expected - set(names))


@pytest.mark.slow
def test_every_pure_module_imports_without_orchestration_libraries() -> None:
    modules = [
        "towerbench." + module_name(path)
        for package in PURE
        for path in sorted((ROOT / package).rglob("*.py"))
        if path.name != "__init__.py"
    ]
    assert loaded_alongside(modules, ORCHESTRATION) == []


@pytest.mark.slow
def test_orchestrating_processes_import_neither_tensorflow_nor_scikit_learn() -> None:
    """The commands and a pool's flow runs leave both to the processes that use them (about 7 s
    and 2 s of CPU per process on 2 slow cores)."""
    modules = [
        *COMMAND_MODULES,
        "towerbench.serve.temporary_server",
        "towerbench.flows.sweep",
        "towerbench.flows.pipeline",
        "towerbench.flows.advise",
    ]
    modules += ["towerbench.flows.fan_out", "towerbench.flows.config_run", "towerbench.api.face"]
    assert loaded_alongside(modules, {"sklearn", "tensorflow"}) == []


# tasks/ is a hall of shared modules (tracking, locks, preflight) and wings, one folder per
# feature. A wing imports the hall, lower floors and the wings before it in this order: advise
# composes the others (its probe trains in a training process, its verdict uses the report's
# statistics); data, training and report know nothing of each other.
WINGS = ("data", "training", "report", "advise")


def wings_imported(path: Path) -> set[str]:
    """The wings of tasks/ that `path` imports."""
    parts = (name.split(".") for name in towerbench_imports(path))
    return {part[1] for part in parts if part[0] == "tasks" and len(part) > 2 and part[1] in WINGS}


def test_tasks_are_a_hall_and_wings() -> None:
    hall = sorted(path.name for path in (ROOT / "tasks").glob("*.py"))
    folders = sorted(
        path.name for path in (ROOT / "tasks").iterdir() if (path / "__init__.py").exists()
    )
    assert len(hall) <= 8, hall
    assert folders == sorted(WINGS)


@pytest.mark.parametrize(
    ("wing", "others"),
    [(wing, set(WINGS) - set(WINGS[: index + 1])) for index, wing in enumerate(WINGS)],
)
def test_wings_import_no_later_wing(wing: str, others: set[str]) -> None:
    offenders = {
        module_name(path): sorted(wings_imported(path) & others)
        for path in sorted((ROOT / "tasks" / wing).rglob("*.py"))
        if wings_imported(path) & others
    }
    assert not offenders, f"tasks/{wing}/ imports a later wing: {offenders}"


def test_the_hall_imports_no_wing() -> None:
    offenders = {
        module_name(path): sorted(wings_imported(path))
        for path in sorted((ROOT / "tasks").glob("*.py"))
        if wings_imported(path)
    }
    assert not offenders, f"the tasks/ hall imports a wing: {offenders}"


@pytest.mark.parametrize("package", FLOORS)
def test_functions_fit_on_one_screen(package: str) -> None:
    """Every function reads as short named steps: none over 60 lines."""
    long = [
        f"{module_name(path)}.{node.name}: {node.end_lineno - node.lineno + 1} lines"
        for path in sorted((ROOT / package).rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno - node.lineno + 1 > 60
    ]
    assert not long, long
