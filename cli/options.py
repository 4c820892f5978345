"""Command-line options generated from the pydantic config, so the CLI never restates a field."""

from __future__ import annotations

import argparse
import types
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from towerbench.config.load import Override


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
    only: frozenset[str] | None = None,
) -> None:
    """Add one `--field-name` option per field of `model` (defaults and help from the model).

    Options left out of the command line are absent from the parsed namespace, so the model's
    own defaults (or a params file) apply. Fields in `as_lists` accept comma-separated values;
    `only` keeps just the fields named.
    """
    for name, field in model.model_fields.items():
        if name in skip or (only is not None and name not in only):
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


def overrides_from_args(
    model: type[BaseModel], args: argparse.Namespace, as_lists: frozenset[str] = frozenset()
) -> list[Override]:
    """The values given for `model`'s options, as overrides of its params.yaml section."""
    return [
        Override(model, name, value, option_name(name))
        for name, value in values_from_args(model, args, as_lists).items()
    ]


def add_params_option(parser: argparse.ArgumentParser, default: Path | None = None) -> None:
    """`--params FILE`: start from a params.yaml; the options given override its values."""
    shown = f" (default: {default})" if default is not None else ""
    parser.add_argument(
        "--params",
        type=Path,
        default=default,
        metavar="FILE",
        help="Start from this params.yaml; options given here override its values, and paths "
        f"in it are relative to its folder{shown}.",
    )


def add_json_option(parser: argparse.ArgumentParser, what: str) -> None:
    """`--json`: the result as one JSON document on stdout, everything else on stderr."""
    parser.add_argument(
        "--json",
        action="store_true",
        help=f"Print {what} as one JSON document on stdout; progress and logs go to stderr.",
    )
