"""Command-line options generated from the pydantic config, so the CLI never restates a field."""

from __future__ import annotations

import argparse
import types
import typing
from typing import Any

from pydantic import BaseModel, ValidationError

from model.errors import TowerbenchError


def option_name(field: str) -> str:
    return "--" + field.replace("_", "-")


def _is_list(annotation: Any) -> bool:
    return typing.get_origin(annotation) is list or any(
        typing.get_origin(arg) is list for arg in typing.get_args(annotation)
    )


def _is_bool(annotation: Any) -> bool:
    return annotation is bool


def _choices(annotation: Any) -> tuple[str, ...] | None:
    if typing.get_origin(annotation) is typing.Literal:
        return tuple(str(choice) for choice in typing.get_args(annotation))
    return None


def _is_optional(annotation: Any) -> bool:
    origin = typing.get_origin(annotation)
    return origin in (typing.Union, types.UnionType) and type(None) in typing.get_args(annotation)


def add_model_options(
    parser: argparse.ArgumentParser,
    model: type[BaseModel],
    skip: frozenset[str] = frozenset(),
    as_lists: frozenset[str] = frozenset(),
) -> None:
    """Add one `--field-name` option per field of `model` (defaults and help from the model).

    Options left out of the command line are absent from the parsed namespace, so the model's
    own defaults (or a params file) apply. Fields in `as_lists` accept comma-separated values.
    """
    for name, field in model.model_fields.items():
        if name in skip:
            continue
        help_text = field.description or ""
        if not field.is_required():
            default = field.get_default(call_default_factory=True)
            help_text += f" (default: {default})"
        help_text = help_text.replace("%", "%%")  # argparse formats help with %-interpolation
        if _is_bool(field.annotation) and name not in as_lists:
            parser.add_argument(
                option_name(name),
                dest=name,
                action=argparse.BooleanOptionalAction,
                default=argparse.SUPPRESS,
                help=help_text,
            )
            continue
        choices = _choices(field.annotation)
        metavar = "{" + ",".join(choices) + "}" if choices else name.upper()
        if name in as_lists or _is_list(field.annotation):
            metavar += "[,...]"
        parser.add_argument(
            option_name(name),
            dest=name,
            default=argparse.SUPPRESS,
            metavar=metavar,
            help=help_text,
        )


def values_from_args(
    model: type[BaseModel], args: argparse.Namespace, as_lists: frozenset[str] = frozenset()
) -> dict[str, Any]:
    """The raw values the user gave for `model`'s fields, lists split on commas."""
    values: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        if not hasattr(args, name):
            continue
        raw = getattr(args, name)
        if isinstance(raw, str) and (name in as_lists or _is_list(field.annotation)):
            values[name] = [item.strip() for item in raw.split(",") if item.strip()]
        elif isinstance(raw, str) and _is_optional(field.annotation) and raw.lower() == "none":
            values[name] = None
        else:
            values[name] = raw
    return values


def describe_validation_error(error: ValidationError, prefix: str = "--") -> str:
    """One line per problem, naming the option as the user typed it."""
    problems = []
    for item in error.errors():
        location = [str(part) for part in item["loc"]]
        name = (prefix + location[0].replace("_", "-")) if location else "input"
        detail = ".".join(location[1:])
        where = f"{name}[{detail}]" if detail else name
        given = item.get("input")
        shown = f" (got {given!r})" if given is not None and not isinstance(given, dict) else ""
        problems.append(f"{where}: {item['msg']}{shown}")
    return "; ".join(problems)


def build_model(model: type[BaseModel], values: dict[str, Any], prefix: str = "--") -> Any:
    """Validate `values` into `model`, turning pydantic's errors into a TowerbenchError."""
    try:
        return model.model_validate(values)
    except ValidationError as error:
        raise TowerbenchError(describe_validation_error(error, prefix)) from None
