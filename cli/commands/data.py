"""`towerbench fetch` and `towerbench preprocess`: options generated from the config models."""

from __future__ import annotations

import argparse
import typing

from pydantic import BaseModel

from towerbench.cli.options import add_model_options, add_params_option, overrides_from_args
from towerbench.config.load import Override, load
from towerbench.config.params import Params
from towerbench.config.sections import DataConfig, FetchConfig, PreprocessConfig
from towerbench.core.errors import TowerbenchError
from towerbench.core.native_logs import import_tensorflow

SOURCES = typing.get_args(FetchConfig.model_fields["source"].annotation)


def _params(args: argparse.Namespace, section: type[BaseModel], extra: list[Override]) -> Params:
    """--params with this command's options on top; these commands never track."""
    overrides = overrides_from_args(section, args) + overrides_from_args(DataConfig, args) + extra
    return load(args.params, overrides, resolve_tracking=False)


def _fetch(args: argparse.Namespace) -> int:
    if args.dataset is not None and args.dataset not in SOURCES:
        choices = ", ".join(SOURCES)
        raise TowerbenchError(f"unknown dataset {args.dataset!r} (choose from {choices})")
    given = [Override(FetchConfig, "source", args.dataset, "DATASET")] if args.dataset else []
    params = _params(args, FetchConfig, given)
    from towerbench.config.sections import dataset_name
    from towerbench.ingest import fetch  # no TensorFlow: fetching only moves files

    folder = fetch(params.fetch, params.data.data_dir)
    print(f"fetched {params.fetch.source} as {dataset_name(params.fetch)!r} into {folder}")
    return 0


def _preprocess(args: argparse.Namespace) -> int:
    params = _params(args, PreprocessConfig, [])
    from towerbench.config.sections import dataset_name
    from towerbench.core.tfrecord_format import dataset_dir
    from towerbench.ingest import fetched_record, preprocess

    name = args.dataset or dataset_name(params.fetch)
    fetched_record(name, params.data.data_dir)  # its errors before TensorFlow loads
    import_tensorflow()
    manifest = preprocess(name, params.preprocess, params.data.data_dir)
    counts = ", ".join(f"{split} {info.examples}" for split, info in manifest.splits.items())
    print(f"preprocessed {name!r} ({counts}) into {dataset_dir(params.data.data_dir, name)}")
    return 0


def _add_common(parser: argparse.ArgumentParser) -> None:
    add_params_option(parser)
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
        help=f"{', '.join(SOURCES)} (default: params file, else digits).",
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
