"""The one exception type towerbench shows to users, and the one way validation errors read."""

from __future__ import annotations

from collections.abc import Callable

from pydantic import ValidationError

Location = tuple[str | int, ...]


class TowerbenchError(Exception):
    """A problem with the user's input or environment, stated in one line.

    The message names the file or parameter and what is wrong with it; the CLI prints it
    without a traceback and exits non-zero.
    """


def dotted(location: Location) -> str:
    """`train.epochs`, `sweep.towers.1`: a location as a params-file key."""
    return ".".join(str(part) for part in location) or "(top level)"


def describe_validation_error(
    error: ValidationError, name_of: Callable[[Location], str] = dotted
) -> str:
    """Every problem on one line, `<where>: <what> (got <value>)`.

    `name_of` says where a location came from as the user wrote it: a file and key, or an option.
    """
    problems = []
    for item in error.errors():
        given = item.get("input")
        shown = f" (got {given!r})" if given is not None and not isinstance(given, dict) else ""
        message = item["msg"].removeprefix("Value error, ")  # a validator's own ValueError
        problems.append(f"{name_of(tuple(item['loc']))}: {message}{shown}")
    return "; ".join(problems)
