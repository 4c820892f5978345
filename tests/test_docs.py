"""The user docs point at code that exists: every module path they name (`flows/sweep.py`,
`towerbench.flows.sweep`), every `path.py:name` (a function, class, method or constant of that
module) and every relative link. The code is read with `ast`, never imported, so this stays in the
fast tier."""

from __future__ import annotations

import ast
import re
import tomllib
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# The pages that describe today's code (the CIFAR-10 reports and design notes are dated records).
DOCS = (
    "README.md",
    "docs/architecture.md",
    "docs/training.md",
    "docs/multi-host.md",
    "docs/ui.md",
    "docs/benchmark-history.md",
    "docs/your-model.md",
    "docs/cifar10/README.md",
    "docs/findings.md",
    "docs/setup.md",
    "docs/faults.md",
    "docs/keras.md",
)


def package_folders() -> dict[str, str]:
    """Subpackage name -> its folder, as pyproject.toml maps them into `towerbench`."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    mapping = config["tool"]["setuptools"]["package-dir"]
    return {name.removeprefix("towerbench."): folder for name, folder in mapping.items()}


PACKAGES = package_folders()
TOP = "|".join(sorted({*(folder for folder in PACKAGES.values()), "tests"}))
# `flows/sweep.py`, `tasks/report/publish.py:make_report`, `model/towers.py:TowerTrainer._step`
FILE_PATH = re.compile(
    rf"(?<![\w./-])((?:{TOP})/(?:[\w-]+/)*[\w-]+\.py)(?::([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)?))?"
)
# `towerbench.flows.sweep`; MLflow tags such as `towerbench.kind` are not module names.
PACKAGE_NAMES = "|".join(sorted(PACKAGES))
DOTTED = re.compile(rf"(?<![\w.])towerbench\.(?:{PACKAGE_NAMES})(?:\.\w+)*")
LINK = re.compile(r"\]\(([^)\s]+)\)")


@cache
def defined_names(path: Path) -> dict[str, set[str]]:
    """Top-level names of a module ("" -> names) and each class's attribute names."""
    tree = ast.parse(path.read_text(), filename=str(path))

    def names_in(body: list[ast.stmt]) -> set[str]:
        found: set[str] = set()
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                found.add(node.name)
            elif isinstance(node, ast.Assign):
                found.update(t.id for t in node.targets if isinstance(t, ast.Name))
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                found.add(node.target.id)
        return found

    names = {"": names_in(tree.body)}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            names[node.name] = names_in(node.body)
    return names


def missing_attribute(path: Path, dotted_name: str) -> bool:
    """Whether `Name` or `Class.attribute` is not defined in the module at `path`."""
    owner, _, attribute = dotted_name.rpartition(".")
    names = defined_names(path)
    if owner:
        return owner not in names or attribute not in names[owner]
    return attribute not in names[""]


def check_file_path(relative: str, attribute: str | None) -> str | None:
    path = ROOT / relative
    if not path.is_file():
        return f"{relative}: no such module"
    if attribute and missing_attribute(path, attribute):
        return f"{relative}:{attribute}: no such name in {relative}"
    return None


def check_dotted(name: str) -> str | None:
    """`towerbench.<package>.<module>[.<name>[.<attribute>]]`: the longest prefix that is a module
    or package, and at most two names defined in it."""
    parts = name.split(".")[1:]
    base = ROOT / PACKAGES[parts[0]]
    for length in range(len(parts), 0, -1):
        relative = base.joinpath(*parts[1:length])
        module = relative.with_suffix(".py") if length > 1 else None
        if module is not None and module.is_file():
            rest = parts[length:]
            if len(rest) > 2 or (rest and missing_attribute(module, ".".join(rest))):
                return f"{name}: no such name in {module.relative_to(ROOT)}"
            return None
        if relative.is_dir() and length == len(parts):
            return None
    return f"{name}: no such module"


def references(text: str) -> list[tuple[str, str | None]]:
    """Every module reference in `text`: (what was written, its problem or None)."""
    found = []
    for match in FILE_PATH.finditer(text):
        found.append((match.group(0), check_file_path(match.group(1), match.group(2))))
    for match in DOTTED.finditer(text):
        found.append((match.group(0), check_dotted(match.group(0))))
    return found


def broken_links(text: str, folder: Path) -> list[str]:
    """Relative links (files, images) that lead nowhere from `folder`."""
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue  # a URL, or an anchor on the same page
        if not (folder / target.split("#")[0]).exists():
            broken.append(target)
    return broken


@pytest.mark.parametrize("doc", DOCS)
def test_named_modules_exist(doc: str) -> None:
    problems = [problem for _, problem in references((ROOT / doc).read_text()) if problem]
    assert not problems, f"{doc} names code that does not exist: {problems}"


@pytest.mark.parametrize("doc", DOCS)
def test_relative_links_lead_somewhere(doc: str) -> None:
    path = ROOT / doc
    broken = broken_links(path.read_text(), path.parent)
    assert not broken, f"{doc} links to files that do not exist: {broken}"


def test_architecture_page_names_the_path_of_a_sweep() -> None:
    """The page walks a configuration through these modules (and the checker sees them)."""
    named = {written for written, _ in references((ROOT / "docs/architecture.md").read_text())}
    for step in (
        "config/load.py:load",
        "cli/commands/orchestrate.py:run_sweep_command",
        "flows/sweep.py:plan_sweep",
        "flows/sweep.py:open_sweep",
        "flows/sweep.py:train_each",
        "flows/sweep.py:finish_sweep",
        "tasks/training/fork_server.py:TrainingProcess",
        "tasks/training/worker.py:forked_main",
        "model/training.py:train",
        "model/towers.py:TowerTrainer._step",
        "tasks/tracking.py:create_config_run",
        "tasks/report/publish.py:make_report",
    ):
        assert step in named, f"docs/architecture.md no longer names {step}"


@pytest.mark.parametrize(
    "text",
    [
        "`flows/no_such_module.py`",
        "`flows/sweep.py:no_such_step`",
        "`model/towers.py:TowerTrainer.no_such_method`",
        "`towerbench.flows.no_such_module`",
        "`towerbench.flows.sweep.no_such_step`",
    ],
)
def test_a_wrong_name_is_caught(text: str) -> None:
    assert [problem for _, problem in references(text) if problem]


def test_an_existing_name_passes() -> None:
    text = (
        "`flows/sweep.py:sweep`, `towerbench.tasks.training.fork_server.PRELOAD`, `tasks/report/`"
    )
    assert [problem for _, problem in references(text) if problem] == []


README_LINES = 300  # the project's limit; details go to docs/


def test_the_readme_stays_within_its_line_limit() -> None:
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines <= README_LINES, (
        f"README.md has {lines} lines (limit {README_LINES}): move detail to docs/"
    )
