"""The recipe file `towerbench advise` writes (`advise-<id>.yaml`): a params file whose header
says each choice and why, one `#   name: value — reason` line each, which
`towerbench.keras.recipe` reads back. Both directions live here so they cannot drift apart."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from towerbench.core.errors import TowerbenchError

FIRST_LINE = "# towerbench advise (MLflow run {run_id}): the recipe, each choice and why."
LAST_LINE = "# `towerbench sweep --params THIS_FILE` runs its verification again."
# The choices a recipe makes, as its header names them (tasks/advise/recipe.py: Recipe.lines).
CHOICES = ("optimizer", "scaling", "warmup epochs", "budget", "schedule")
# Written since BatchNorm's lag was measured: a file without it is still read.
LATER_CHOICES = ("batchnorm statistics",)
_CHOICE_LINE = re.compile(rf"^#   ({'|'.join(CHOICES + LATER_CHOICES)}): (.+?) — (.+)$")
_FIRST_LINE = re.compile(r"^# towerbench advise \(MLflow run (\w+)\)")


@dataclass(frozen=True)
class Choice:
    """One choice of a recipe: its value, and the reason advise gave (the number behind it)."""

    value: str | float
    reason: str


def _value(text: str) -> str | float:
    """A choice's value as the header says it: a number (warmup epochs) or a name."""
    try:
        return float(text)
    except ValueError:
        return text


def recipe_file_text(run_id: str, sections: dict[str, Any], lines: list[str]) -> str:
    """The file: the header (`lines`, the probe's and the recipe's, as comments), then
    `sections` as YAML."""
    header = [FIRST_LINE.format(run_id=run_id), *(f"#   {line}" for line in lines), LAST_LINE]
    return "\n".join(header) + "\n" + yaml.safe_dump(sections, sort_keys=False)


def recipe_choices(path: Path) -> tuple[str, dict[str, Choice]]:
    """(the advise run's id, each choice by its header name) of the recipe file at `path`;
    one clear error when it is not a recipe file advise wrote."""
    try:
        lines = Path(path).read_text().splitlines()
    except FileNotFoundError:
        raise TowerbenchError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as error:
        raise TowerbenchError(f"{path}: cannot be read: {error}") from None
    first = _FIRST_LINE.match(lines[0]) if lines else None
    matches = [_CHOICE_LINE.match(line) for line in lines]
    choices = {m.group(1): Choice(_value(m.group(2)), m.group(3)) for m in matches if m}
    missing = [name for name in CHOICES if name not in choices]
    if first is None or missing:
        what = "its first line" if first is None else f"its header's {', '.join(missing)}"
        raise TowerbenchError(
            f"{path}: not a recipe file `towerbench advise` wrote (no {what}); "
            "give the advise-<id>.yaml it printed"
        )
    return first.group(1), choices
