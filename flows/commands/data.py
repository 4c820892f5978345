"""`towerbench fetch` and `towerbench preprocess`: options generated from the config models."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import yaml

from flows.options import add_model_options, build_model, values_from_args
from model.config import DataConfig, FetchConfig, PreprocessConfig
from model.errors import TowerbenchError


def read_params(path: Path | None, section: str) -> dict[str, Any]:
    """One section of a params.yaml (empty when no file is given)."""
    if path is None:
        return {}
    try:
        document = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as error:
        raise TowerbenchError(f"{path}: cannot read parameters ({error})") from None
    values = document.get(section) or {}
    if not isinstance(values, dict):
        raise TowerbenchError(f"{path}: section {section!r} must be a mapping")
    return values


def _config(model: type, args: argparse.Namespace, section: str, **overrides: Any) -> Any:
    values = {**read_params(args.params, section), **values_from_args(model, args), **overrides}
    return build_model(model, values)


def _fetch(args: argparse.Namespace) -> int:
    from model.sources import dataset_name, fetch, source_for

    overrides = {}
    if args.dataset is not None:
        source_for(args.dataset)  # An unknown name is refused here, naming the choices.
        overrides["source"] = args.dataset
    config = _config(FetchConfig, args, "fetch", **overrides)
    data = _config(DataConfig, args, "data")
    folder = fetch(config, data.data_dir)
    print(f"fetched {config.source} as {dataset_name(config)!r} into {folder}")
    return 0


def _preprocess(args: argparse.Namespace) -> int:
    from model.sources import dataset_name, preprocess
    from model.tfrecords import dataset_dir

    config = _config(PreprocessConfig, args, "preprocess")
    data = _config(DataConfig, args, "data")
    name = args.dataset or dataset_name(build_model(FetchConfig, read_params(args.params, "fetch")))
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
