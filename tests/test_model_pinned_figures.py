"""A digits run's figures, pinned: restructuring the trainer (its parts, its factory) must give
the same numbers for the same seeds. Each run exercises parts of the step: weight decay, the
weight EMA, a piecewise LR drop and the noise scale; AdaScale's gain and progress; float16's
loss scale. The figures were measured before the trainer was split into parts (commit
6ddbc5f); a change that alters any step's arithmetic moves them beyond the tolerance. The `lr`
column is the mean LR of the epoch's steps since issue 63 item 3 (before: the LR at its end).

TensorFlow's CPU kernels round differently with and without AVX-512 (a step's loss moves by one
float32 rounding, and 20 steps carry it to 1e-5..1e-3): the figures are pinned per instruction
set, those without AVX-512 measured on an AVX2 AMD EPYC on 2026-12-07 at 967af8d."""

from pathlib import Path

import fixtures_model
import numpy as np
import pytest

from towerbench.config.sections import TrainConfig
from towerbench.model import training

pytestmark = pytest.mark.slow

COMMON = {"dataset": "digits", "towers": 2, "global_batch": 64, "base_lr": 0.2}
RUNS = {
    "momentum_decay_ema": {
        "epochs": 2,
        "weight_decay": 1e-3,
        "ema_decay": 0.9,
        "decay": "piecewise",
        "decay_boundaries": [1.5],
        "seed": 3,
    },
    "adascale": {"epochs": 2, "lr_scaling": "adascale", "reference_batch": 32, "seed": 4},
    "float16": {"epochs": 1, "precision": "mixed_float16", "seed": 5},
}
COLUMNS = (
    "step",
    "lr",
    "cross_entropy",
    "weight_decay_loss",
    "train_accuracy",
    "test_cross_entropy",
    "test_accuracy",
    "ema_test_accuracy",
    "noise_scale",
    "adascale_gain",
    "adascale_tau",
)
# Per instruction set, per epoch the COLUMNS, then the sum of |w| over the final weights.
# fmt: off
AVX512_PINNED = {
    "momentum_decay_ema": (
        (10, 0.200000003, 2.304064865, 0.1053806692, 0.095, 2.262045407, 0.1165048544, 0.1165048544, 175.2753659, None, None),  # noqa: E501
        (20, 0.1100000022, 2.089411933, 0.1038470268, 0.25, 1.516827481, 0.5048543689, 0.4854368932, 17.91685675, None, None),  # noqa: E501
        8816.604865,
    ),
    "adascale": (
        (10, 0.2668784171, 2.29817997, 0.3903939426, 0.13, 2.225678231, 0.2233009709, 0.1941747573, 341.957839, 1.837264299, 16.58983201),  # noqa: E501
        (20, 0.109651164, 1.939040744, 0.3526614606, 0.28, 1.449080088, 0.572815534, 0.640776699, 21.86976228, 1.256172657, 30.19579923),  # noqa: E501
        (27, 0.02639739242, 1.448278955, 0.341457516, 0.4508928571, 1.330854249, 0.5145631068, 0.6699029126, 7.555767565, 1.106636167, 38.29738951),  # noqa: E501
        8430.12077073,
    ),
    "float16": (
        (10, 0.1100000007, 2.315333761, 0.4106713533, 0.1083333333, 2.27508782, 0.2621359223, 0.1262135922, 91.86588184, None, None),  # noqa: E501
        8706.30913247,
    ),
}
AVX2_PINNED = {
    "momentum_decay_ema": (
        (10, 0.200000003, 2.304064833, 0.1053806692, 0.095, 2.262045555, 0.1165048544, 0.1165048544, 175.2753785, None, None),  # noqa: E501
        (20, 0.1100000022, 2.089276136, 0.1038470641, 0.25, 1.516047505, 0.5048543689, 0.4854368932, 17.94599817, None, None),  # noqa: E501
        8816.59628784,
    ),
    "adascale": (
        (10, 0.2668784142, 2.298179995, 0.3903939426, 0.13, 2.225678231, 0.2233009709, 0.1941747573, 341.9578257, 1.837264299, 16.58983129),  # noqa: E501
        (20, 0.1096511614, 1.939040623, 0.3526614606, 0.28, 1.449079347, 0.572815534, 0.640776699, 21.86973844, 1.256172419, 30.19579649),  # noqa: E501
        (27, 0.02639740453, 1.448279074, 0.3414575458, 0.4508928571, 1.330855286, 0.5145631068, 0.6699029126, 7.555739481, 1.106635928, 38.29738641),  # noqa: E501
        8430.12098,
    ),
    "float16": (
        (10, 0.1100000007, 2.315331968, 0.4106716514, 0.1083333333, 2.275099523, 0.2621359223, 0.1262135922, 91.77188004, None, None),  # noqa: E501
        8706.31432089,
    ),
}
# fmt: on


def _pinned_for_this_cpu() -> dict:
    """The figures of this machine's instruction set (the CPU flags Linux reports)."""
    cpuinfo = Path("/proc/cpuinfo")
    flags = set(cpuinfo.read_text().partition("\nflags")[2].partition("\n")[0].split())
    if "avx512f" in flags:
        return AVX512_PINNED
    assert "avx2" in flags, f"no figures pinned for a CPU without AVX2 or AVX-512 ({cpuinfo})"
    return AVX2_PINNED


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return fixtures_model.write_digits(tmp_path_factory.mktemp("data"), test=103)


@pytest.mark.parametrize("name", RUNS)
def test_a_digits_run_gives_its_pinned_figures(data_dir, name):
    result = training.train(TrainConfig(**COMMON, **RUNS[name]), data_dir)
    *epochs, weights_abs_sum = _pinned_for_this_cpu()[name]
    measured = [tuple(getattr(record, column) for column in COLUMNS) for record in result.history]
    assert len(measured) == len(epochs)
    for got, pinned in zip(measured, epochs, strict=True):
        for column, value, expected in zip(COLUMNS, got, pinned, strict=True):
            if expected is None:
                assert value is None, column
            else:
                assert value == pytest.approx(expected, rel=1e-8, abs=1e-9), (column, got[0])
    total = sum(float(np.sum(np.abs(w.astype(np.float64)))) for w in result.model.get_weights())
    assert total == pytest.approx(weights_abs_sum, rel=1e-10)
