"""CLI options are generated from the pydantic config and validated by it."""

from __future__ import annotations

import argparse

import pytest

from flows.options import add_model_options, build_model, values_from_args
from model.config import TrainConfig
from model.errors import TowerbenchError


def parse_train_config(argv: list[str]) -> TrainConfig:
    parser = argparse.ArgumentParser()
    add_model_options(parser, TrainConfig)
    args = parser.parse_args(argv)
    return build_model(TrainConfig, values_from_args(TrainConfig, args))


def test_every_config_field_is_an_option_with_its_description() -> None:
    parser = argparse.ArgumentParser()
    add_model_options(parser, TrainConfig)
    options = {action.dest: action for action in parser._actions if action.dest != "help"}
    assert set(options) == set(TrainConfig.model_fields)
    for name, field in TrainConfig.model_fields.items():
        assert field.description and field.description in options[name].help


def test_given_options_override_defaults_and_are_typed() -> None:
    config = parse_train_config(
        ["--towers", "4", "--lr-scaling", "sqrt", "--no-random-flip", "--decay-boundaries", "3,6"]
    )
    assert config.towers == 4
    assert config.lr_scaling == "sqrt"
    assert config.random_flip is False
    assert config.decay_boundaries == [3.0, 6.0]
    assert config.global_batch == TrainConfig.model_fields["global_batch"].default


def test_optional_field_accepts_none() -> None:
    assert parse_train_config(["--crop-size", "none"]).crop_size is None


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--towers", "0"], "--towers"),
        (["--aggregation", "median"], "--aggregation"),
        (["--global-batch", "many"], "--global-batch"),
    ],
)
def test_bad_values_name_the_option(argv: list[str], named: str) -> None:
    with pytest.raises(TowerbenchError, match=f"^{named}: "):
        parse_train_config(argv)


def test_every_subcommand_renders_its_help(capsys: pytest.CaptureFixture[str]) -> None:
    from flows.cli import build_parser

    parser = build_parser()
    commands = next(
        action for action in parser._actions if isinstance(action, argparse._SubParsersAction)
    ).choices
    assert {"fetch", "preprocess", "train", "gradcheck", "pipeline", "sweep", "bench"} <= set(
        commands
    )
    for name in commands:
        with pytest.raises(SystemExit) as exit_info:
            parser.parse_args([name, "--help"])
        assert exit_info.value.code == 0, name
        assert f"usage: towerbench {name}" in capsys.readouterr().out
