"""CLI options are generated from the pydantic config; one loader puts them over params.yaml."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from towerbench.cli.commands.orchestrate import sweep_run_from_args
from towerbench.cli.main import build_parser
from towerbench.cli.options import add_model_options, overrides_from_args
from towerbench.config.load import load
from towerbench.config.model_ref import BUILTIN_MODELS
from towerbench.config.sections import TrainConfig
from towerbench.core.errors import TowerbenchError

COMMANDS_WITH_PARAMS = (
    "fetch",
    "preprocess",
    "train",
    "gradcheck",
    "sweep",
    "pipeline",
    "report",
    "bench",
)


def parse_train_config(argv: list[str]) -> TrainConfig:
    parser = argparse.ArgumentParser()
    add_model_options(parser, TrainConfig)
    return load(None, overrides_from_args(TrainConfig, parser.parse_args(argv))).train


def parse(argv: list[str]) -> argparse.Namespace:
    return build_parser().parse_args(argv)


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


@pytest.mark.parametrize("command", COMMANDS_WITH_PARAMS)
def test_every_command_takes_params(command: str, tmp_path: Path) -> None:
    required = ["--sweep", "run-id"] if command == "report" else []
    args = parse([command, "--params", str(tmp_path / "params.yaml"), *required])
    assert args.params == tmp_path / "params.yaml"


def test_options_override_the_file_and_paths_follow_where_they_were_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    params_file = project / "params.yaml"
    params_file.write_text(
        "data: {data_dir: shared-data}\n"
        "train: {dataset: digits, towers: 2, global_batch: 64, epochs: 3}\n"
        "report: {report_dir: out}\n"
    )
    monkeypatch.chdir(tmp_path)
    args = parse(["train", "--params", str(params_file), "--towers", "4"])
    params = load(args.params, overrides_from_args(TrainConfig, args))
    assert (params.train.towers, params.train.global_batch, params.train.epochs) == (4, 64, 3)
    # The file's paths are relative to its folder, not to where the command runs.
    assert params.data.data_dir == project / "shared-data"
    assert params.report.report_dir == project / "out"
    # Presets still fill only what neither the file nor the options gave.
    assert params.train.optimizer == "momentum" and "epochs" not in params.train.preset_fields()

    sweep = sweep_run_from_args(
        parse(["sweep", "--params", str(params_file), "--report-dir", "here", "--epochs", "1,2"])
    )
    assert sweep.data.data_dir == project / "shared-data"  # the file's data section counts
    assert sweep.report.report_dir == tmp_path / "here"  # an option's path is the shell's
    assert sweep.sweep.grid.epochs == [1.0, 2.0] and sweep.train.global_batch == 64


def test_one_message_names_the_file_key_and_the_option_as_typed(tmp_path: Path) -> None:
    params_file = tmp_path / "params.yaml"
    params_file.write_text("train: {epochs: many}\nsweep: {towers: [1, 2]}\n")
    args = parse(["sweep", "--params", str(params_file), "--seeds", "0,x"])
    with pytest.raises(TowerbenchError) as error:
        sweep_run_from_args(args)
    problems = str(error.value).split("; ")
    assert any(p.startswith(f"{params_file}: train.epochs: ") for p in problems), problems
    assert any(p.startswith("--seeds[1]: ") and "'x'" in p for p in problems), problems


def test_an_invalid_combination_of_the_sweep_is_refused_before_anything_runs() -> None:
    args = parse(["sweep", "--towers", "3", "--global-batch", "32", "--seeds", "0"])
    with pytest.raises(TowerbenchError, match="not divisible by --towers 3"):
        sweep_run_from_args(args)


def test_gradcheck_accepts_every_network_the_training_config_knows() -> None:
    for network in (*BUILTIN_MODELS, "mypackage.nets:build"):
        args = parse(["gradcheck", "--model", network, "--towers", "2", "--global-batch", "8"])
        config = load(None, overrides_from_args(TrainConfig, args)).train
        assert (config.model, config.towers, config.global_batch) == (network, 2, 8)
    with pytest.raises(TowerbenchError, match="^--model: "):
        load(None, overrides_from_args(TrainConfig, parse(["gradcheck", "--model", "vgg"])))


def test_every_subcommand_renders_its_help(capsys: pytest.CaptureFixture[str]) -> None:
    parser = build_parser()
    commands = next(
        action for action in parser._actions if isinstance(action, argparse._SubParsersAction)
    ).choices
    assert set(COMMANDS_WITH_PARAMS) <= set(commands)
    for name in commands:
        with pytest.raises(SystemExit) as exit_info:
            parser.parse_args([name, "--help"])
        assert exit_info.value.code == 0, name
        assert f"usage: towerbench {name}" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        # At its default value too: the option was typed, and adam would ignore it.
        (
            ["--optimizer", "adam", "--momentum", "0.9"],
            "--momentum: does not apply to --optimizer ",
        ),
        (["--optimizer", "sgd", "--beta-1", "0.9"], "--beta-1: does not apply to --optimizer sgd"),
    ],
)
def test_an_option_the_optimizer_ignores_is_refused(argv: list[str], message: str) -> None:
    with pytest.raises(TowerbenchError, match=f"^{message}"):
        parse_train_config(argv)
    assert parse_train_config(["--optimizer", "adam", "--beta-1", "0.9"]).optimizer == "adam"
