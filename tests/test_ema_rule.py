"""What counts steps, scaled (issue 63 item 2): the EMA rule's rho -> rho**k for BatchNorm's
momentum and the weight EMA, and which BatchNorm statistics the test accuracy uses; set from
the CLI, the Prefect form and Python alike."""

from __future__ import annotations

import argparse

import pytest

from towerbench.api.inputs import train_overrides
from towerbench.cli.options import add_model_options, overrides_from_args
from towerbench.config.load import load, override_at
from towerbench.config.sections import TrainConfig
from towerbench.core.errors import TowerbenchError
from towerbench.tasks.tracking import effective_optimizer


def test_the_ema_rule_raises_each_momentum_to_the_batch_ratio() -> None:
    config = TrainConfig(global_batch=512, reference_batch=128, ema_scaling="ema_rule")
    assert config.ema_scale == 4.0
    assert config.scaled_momentum(0.99) == pytest.approx(0.99**4)  # 0.9606
    smaller = config.model_copy(update={"global_batch": 32})
    assert smaller.ema_scale == 0.25 and smaller.scaled_momentum(0.9) == pytest.approx(0.9**0.25)
    plain = TrainConfig(global_batch=512, reference_batch=128)
    assert plain.ema_scale == 1.0 and plain.scaled_momentum(0.99) == 0.99
    effective = effective_optimizer(config)
    assert effective["ema_scale"] == 4.0
    assert effective["ema_decay"] == pytest.approx(config.ema_decay**4)
    assert "ema_scale" not in effective_optimizer(plain)


def _cli(argv: list[str]) -> TrainConfig:
    parser = argparse.ArgumentParser()
    add_model_options(parser, TrainConfig)
    return load(None, overrides_from_args(TrainConfig, parser.parse_args(argv))).train


def test_the_settings_come_from_the_cli_the_form_and_python_alike() -> None:
    expected = ("ema_rule", "recomputed")
    cli = _cli(["--ema-scaling", "ema_rule", "--eval-bn", "recomputed"])
    form = load(
        None,
        [
            override_at("train.ema_scaling", "ema_rule", "advanced.train.ema_scaling"),
            override_at("train.eval_bn", "recomputed", "advanced.train.eval_bn"),
        ],
    ).train
    python = load(None, train_overrides({"ema_scaling": "ema_rule", "eval_bn": "recomputed"}))
    for config in (cli, form, python.train):
        assert (config.ema_scaling, config.eval_bn) == expected
    with pytest.raises(TowerbenchError, match="eval_bn"):
        load(None, train_overrides({"eval_bn": "exact"}))
