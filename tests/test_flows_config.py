"""Sweep expansion, params.yaml loading and the sweep CLI's options (no training)."""

from __future__ import annotations

from pathlib import Path

import pytest

from towerbench.cli.commands.orchestrate import sweep_run_from_args
from towerbench.cli.main import build_parser
from towerbench.config.grid import expand, run_name
from towerbench.config.load import Override, load
from towerbench.config.params import SweepGrid, TrackingConfig
from towerbench.config.sections import TrainConfig
from towerbench.config.tracking_uri import resolve_tracking
from towerbench.core.errors import TowerbenchError

ROOT = Path(__file__).resolve().parents[1]


def test_product_of_the_lists_with_equivalent_runs_collapsed() -> None:
    sweep = SweepGrid(
        towers=[1, 4],
        aggregation=["mean", "sum"],
        lr_scaling=["none", "linear", "sqrt"],
        warmup_epochs=[0, 2],
        seeds=[0, 1],
        per_tower_batch=128,
    )
    runs = expand(TrainConfig(reference_batch=128), sweep)
    names = [run_name(run) for run in runs]
    # 1 tower (batch 128 = reference): every rule, warmup and aggregation is the same run.
    assert [name for name in names if name.startswith("towers=1")] == [
        "towers=1 agg=mean lr=none warmup=0 seed=0",
        "towers=1 agg=mean lr=none warmup=0 seed=1",
    ]
    # 4 towers: 2 aggregations x (none without warmup + linear/sqrt with 0 or 2) x 2 seeds.
    assert len([name for name in names if name.startswith("towers=4")]) == 2 * 5 * 2
    assert len(set(names)) == len(names)
    assert {run.global_batch for run in runs if run.towers == 4} == {512}


def test_workers_are_an_axis_whose_global_batch_counts_every_tower() -> None:
    """1 worker x 4 towers against 2 workers x 2 towers at the same global batch; 1 x 1 alone
    is the baseline (its aggregation collapses), 2 x 1 keeps both aggregations."""
    sweep = SweepGrid(
        towers=[1, 2, 4], workers=[1, 2], aggregation=["mean", "sum"], seeds=[0], per_tower_batch=32
    )
    runs = {run_name(run): run for run in expand(TrainConfig(reference_batch=32), sweep)}
    four = [run for run in runs.values() if run.replicas == 4]
    assert {(run.workers, run.towers, run.global_batch) for run in four} == {
        (1, 4, 128),
        (2, 2, 128),
    }
    assert "workers=2 towers=2 agg=mean lr=linear warmup=0 seed=0" in runs
    assert [name for name in runs if "towers=1 " in name and "workers" not in name] == [
        "towers=1 agg=mean lr=none warmup=0 seed=0"
    ]
    assert len([run for run in runs.values() if (run.workers, run.towers) == (2, 1)]) == 2


def test_any_training_field_can_be_swept_and_invalid_combinations_are_named() -> None:
    sweep = SweepGrid(towers=[2], seeds=[0], grid={"epochs": [1, 3], "optimizer": ["sgd"]})
    assert sorted(run.epochs for run in expand(TrainConfig(), sweep)) == [1, 3]
    assert "epochs=3" in run_name(expand(TrainConfig(), sweep)[1], ["epochs"])
    with pytest.raises(TowerbenchError, match="per_tower_batch or grid.global_batch"):
        expand(TrainConfig(), SweepGrid(per_tower_batch=8, grid={"global_batch": [8, 16]}))


def test_params_file_unknown_key_and_wrong_type_name_file_and_key(tmp_path) -> None:
    path = tmp_path / "params.yaml"
    path.write_text("sweep:\n  towers: [1, 2]\n  tower: [4]\n")
    with pytest.raises(TowerbenchError, match=r"params.yaml: sweep.tower: Extra inputs"):
        load(path)
    path.write_text("train:\n  epochs: many\n")
    with pytest.raises(TowerbenchError, match=r"params.yaml: train.epochs: .*'many'"):
        load(path)
    with pytest.raises(TowerbenchError, match="no such file"):
        load(tmp_path / "absent.yaml")


def test_project_params_build_the_default_pipeline_with_absolute_locations() -> None:
    params = load(ROOT / "params.yaml")
    runs = expand(params.train, params.sweep)
    # `make run`: beside linear scaling at 4 towers (unstable in one seed) the remedy its verdicts
    # advise, adascale at the same towers and batch; six runs, two seeds each.
    assert sorted((run.towers, run.lr_scaling, run.seed) for run in runs) == [
        (towers, rule, seed)
        for towers, rule in ((1, "none"), (4, "adascale"), (4, "linear"))
        for seed in (0, 1)
    ]
    assert {run.aggregation for run in runs} == {"mean"} and params.train.epochs == 8
    assert params.data.data_dir.is_absolute() and params.report.report_dir.is_absolute()
    assert params.nightly.cron.split()[1:] == ["3", "*", "*", "*"]  # nightly
    nightly = params.nightly_params()  # the same sweep, patched
    assert {(run.towers, run.epochs) for run in expand(nightly.train, nightly.sweep)} == {
        (1, 6),
        (2, 6),
    }
    assert {run.lr_scaling for run in expand(nightly.train, nightly.sweep)} == {"none", "linear"}
    assert nightly.train.base_lr == params.train.base_lr


def test_a_nightly_patch_is_checked_where_it_is_written(tmp_path) -> None:
    path = tmp_path / "params.yaml"
    path.write_text("nightly:\n  train: {epochs: -1}\n")
    with pytest.raises(TowerbenchError, match=r"params.yaml: nightly.train.epochs: .*than 0"):
        load(path)
    path.write_text("nightly:\n  sweep: {tower: [1]}\n")
    with pytest.raises(TowerbenchError, match=r"params.yaml: nightly.sweep.tower: Extra"):
        load(path)


def test_the_old_benchmark_section_is_read_as_nightly_with_a_notice(tmp_path, capsys) -> None:
    path = tmp_path / "params.yaml"
    path.write_text("benchmark:\n  train: {epochs: 3}\n")
    assert load(path).nightly_params().train.epochs == 3
    assert capsys.readouterr().err == (
        f"{path}: `benchmark:` is now `nightly:`; the old name is read until the next release\n"
    )


def test_tracking_uri_resolution(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    relative = resolve_tracking(TrackingConfig(tracking_uri="sqlite:///runs/mlflow.db"))
    assert relative.tracking_uri == f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}"
    assert relative.artifact_root == (tmp_path / "runs" / "mlartifacts").as_uri()
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    default = resolve_tracking(TrackingConfig(), base_dir=tmp_path)
    assert default.tracking_uri == f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.team:5000")
    assert resolve_tracking(TrackingConfig()).tracking_uri == "http://mlflow.team:5000"
    with pytest.raises(TowerbenchError, match="tracking_uri"):
        resolve_tracking(TrackingConfig(tracking_uri="mlflow.db"))


def test_sweep_options_split_into_train_axes_and_grid() -> None:
    args = build_parser().parse_args(
        [
            "sweep",
            "--dataset",
            "digits",
            "--towers",
            "1,2,4",
            "--seeds",
            "0,1",
            "--epochs",
            "2,4",
            "--base-lr",
            "0.2",
            "--crop-size",
            "none",
        ]
    )
    params = sweep_run_from_args(args)
    assert params.sweep.towers == [1, 2, 4] and params.sweep.seeds == [0, 1]
    assert params.sweep.grid.epochs == [2.0, 4.0]
    assert params.train.base_lr == 0.2 and params.train.crop_size is None
    bad = build_parser().parse_args(["sweep", "--towers", "1,zero"])
    with pytest.raises(TowerbenchError, match="--towers"):
        sweep_run_from_args(bad)


@pytest.mark.parametrize("command", ["pipeline", "sweep", "report", "serve", "ui"])
def test_help_renders(command: str, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args([command, "--help"])
    assert exit_info.value.code == 0 and "--tracking-uri" in capsys.readouterr().out


def test_a_sweep_preset_is_the_experiment_and_options_still_win(tmp_path: Path) -> None:
    """`sweep.preset: cure-updates` in the default params.yaml: the preset's settings replace the
    file's (digits, momentum...), keep its dataset; a command-line option wins over both."""
    text = (
        (ROOT / "params.yaml")
        .read_text()
        .replace("  per_tower_batch: 32\n", "  preset: cure-updates\n")
    )
    (tmp_path / "params.yaml").write_text(text)
    params = load(tmp_path / "params.yaml")
    runs = expand(params.train, params.sweep)
    assert {run.dataset for run in runs} == {"digits"}
    assert {(run.towers, run.epochs, run.lr_scaling) for run in runs} == {
        (1, 5, "none"),
        (4, 20, "sqrt"),
        (4, 20, "linear"),
    }
    assert {(run.model, run.optimizer, run.global_batch // run.towers) for run in runs} == {
        ("tutorial", "sgd", 128)
    }
    args = build_parser().parse_args(
        ["sweep", "--params", str(tmp_path / "params.yaml"), "--epochs", "2"]
    )
    patched = sweep_run_from_args(args)
    assert {run.epochs for run in expand(patched.train, patched.sweep)} == {2, 8}
    args = build_parser().parse_args(["sweep", "--preset", "cure-bn", "--seeds", "0"])
    bn = sweep_run_from_args(args)
    bn_runs = expand(bn.train, bn.sweep)
    assert [(run.model, run.optimizer, run.decay, run.towers) for run in bn_runs] == [
        ("tutorial_bn", "nesterov", "linear", 1),
        ("tutorial_bn", "nesterov", "linear", 4),
    ]


def test_another_optimizer_on_the_command_line_drops_what_the_file_tuned(tmp_path, capsys):
    """The file's momentum and its LR are tuned for momentum: --optimizer adam takes Adam's
    default LR and no momentum, and says which of the file's settings it left out."""
    path = tmp_path / "params.yaml"
    path.write_text("train:\n  optimizer: momentum\n  base_lr: 0.02\n  momentum: 0.95\n")
    adam = load(path, [Override(TrainConfig, "optimizer", "adam", "--optimizer")]).train
    assert (adam.optimizer, adam.base_lr) == ("adam", 0.001)
    assert capsys.readouterr().err == (
        f"--optimizer adam: {path}'s train.base_lr, train.momentum (set for momentum) left "
        "out; adam takes its own defaults\n"
    )
    nesterov = load(path, [Override(TrainConfig, "optimizer", "nesterov", "--optimizer")]).train
    assert (nesterov.base_lr, nesterov.momentum) == (0.02, 0.95)  # the same family keeps both
    given_lr = [
        Override(TrainConfig, "optimizer", "adam", "--optimizer"),
        Override(TrainConfig, "base_lr", 0.003, "--base-lr"),
    ]
    assert load(path, given_lr).train.base_lr == 0.003


def test_the_optimizer_is_a_sweep_axis() -> None:
    """`--optimizer adam,momentum` sweeps both; each run keeps its own optimizer's defaults."""
    args = build_parser().parse_args(["sweep", "--towers", "1", "--optimizer", "adam,momentum"])
    params = sweep_run_from_args(args)
    assert params.sweep.grid.optimizer == ["adam", "momentum"]
    runs = expand(params.train, params.sweep)
    # Adam's default LR; momentum keeps the digits preset's 0.05, tuned for it.
    assert {(run.optimizer, run.base_lr) for run in runs} == {("adam", 0.001), ("momentum", 0.05)}
