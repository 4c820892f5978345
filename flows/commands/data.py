"""`towerbench fetch` and `towerbench preprocess`: options generated from the config models."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from flows.options import add_model_options, build_model, values_from_args
from flows.params import read_sections
from model.config import DataConfig, FetchConfig, PreprocessConfig
from model.errors import TowerbenchError


def _sections(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The sections of --params, read once (none when it is not given)."""
    sections = read_sections(args.params) if args.params is not None else {}
    for name, values in sections.items():
        if values is not None and not isinstance(values, dict):
            raise TowerbenchError(f"{args.params}: section {name!r} must be a mapping")
    return {name: values or {} for name, values in sections.items()}


def _config(
    model: type, sections: dict[str, dict[str, Any]], section: str, args: argparse.Namespace
) -> Any:
    """`model` from its params section, with the options given on the command line winning."""
    return build_model(model, {**sections.get(section, {}), **values_from_args(model, args)})


def _fetch(args: argparse.Namespace) -> int:
    from model.sources import dataset_name, fetch, source_for

    sections = _sections(args)
    if args.dataset is not None:
        source_for(args.dataset)  # An unknown name is refused here, naming the choices.
        sections["fetch"] = {**sections.get("fetch", {}), "source": args.dataset}
    config = _config(FetchConfig, sections, "fetch", args)
    data = _config(DataConfig, sections, "data", args)
    folder = fetch(config, data.data_dir)
    print(f"fetched {config.source} as {dataset_name(config)!r} into {folder}")
    return 0


def _preprocess(args: argparse.Namespace) -> int:
    from model.sources import dataset_name, preprocess
    from model.tfrecords import dataset_dir

    sections = _sections(args)
    config = _config(PreprocessConfig, sections, "preprocess", args)
    data = _config(DataConfig, sections, "data", args)
    name = args.dataset or dataset_name(build_model(FetchConfig, sections.get("fetch", {})))
    manifest = preprocess(name, config, data.data_dir)
    counts = ", ".join(f"{split} {info.examples}" for split, info in manifest.splits.items())
    print(f"preprocessed {name!r} ({counts}) into {dataset_dir(data.data_dir, name)}")
    return 0


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--params",
        type=Path,
        default=None,
        metavar="FILE",
        help="Read defaults from this params.yaml (options given here win).",
    )
    add_model_options(parser, DataConfig)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `fetch` and `preprocess`."""
    fetch = subparsers.add_parser(
        "fetch",
        help="Download/copy a dataset into DATA_DIR/raw/<name>/, verified.",
        description="Download/copy a dataset into DATA_DIR/raw/<name>/, verified by md5.",
    )
    fetch.add_argument(
        "dataset",
        nargs="?",
        metavar="DATASET",
        help="digits, cifar10, cifar100 or imagefolder (default: params file, else digits).",
    )
    add_model_options(fetch, FetchConfig, skip=frozenset({"source"}))
    _add_common(fetch)
    fetch.set_defaults(handler=_fetch)

    preprocess = subparsers.add_parser(
        "preprocess",
        help="Turn DATA_DIR/raw/<name>/ into sharded TFRecords and a manifest.",
        description="Turn DATA_DIR/raw/<name>/ into DATA_DIR/tfrecords/<name>/ (TFRecords + "
        "manifest.json).",
    )
    preprocess.add_argument(
        "dataset",
        nargs="?",
        metavar="NAME",
        help="Name the dataset was fetched as (default: from the params file, else digits).",
    )
    add_model_options(preprocess, PreprocessConfig)
    _add_common(preprocess)
    preprocess.set_defaults(handler=_preprocess)
