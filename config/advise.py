"""What `towerbench advise` is asked (`AdviseConfig`), and the runs it probes and verifies.

The reference is the 1-tower run of the params file: `train:` with one tower at the per-tower
batch P (`sweep.per_tower_batch`, else `train.global_batch`). The recipe is for K towers on each
of N workers at P examples each, the global batch K N P. The verification is a sweep of the
reference against the recipe's run, for S seeds.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from towerbench.config.grid import expand
from towerbench.config.params import Params, SweepGrid
from towerbench.config.sections import StrictModel, TrainConfig

RULES = ("none", "linear", "sqrt", "adascale")


class AdviseConfig(StrictModel):
    """The towers to find a recipe for, and how hard to check it."""

    towers: int = Field(ge=2, le=1024, description="Towers per worker the recipe is for.")
    workers: int = Field(1, ge=1, le=1024, description="Workers, each with `towers` towers.")
    seeds: int = Field(
        3, ge=1, le=20, description="Seeds of the verification (1 tower against the recipe)."
    )
    verify: bool = Field(
        True, description="Train 1 tower against the recipe's towers to check it (a sweep)."
    )
    probe_steps: int = Field(
        200,
        ge=20,
        le=5000,
        description="Steps of each probe run (the noise scale, each candidate LR).",
    )

    @property
    def replicas(self) -> int:
        return self.towers * self.workers


def per_tower_batch(params: Params) -> int:
    """P: the sweep's per-tower batch, else the file's (1-tower) global batch."""
    return params.sweep.per_tower_batch or params.train.global_batch


def reference_config(params: Params) -> TrainConfig:
    """The 1-tower run the recipe must match: `train:` at one tower, batch P."""
    values = params.train.model_dump(exclude_unset=True)
    values.update(towers=1, workers=1, global_batch=per_tower_batch(params))
    return TrainConfig.model_validate(values)


def verification_grid(
    advice: AdviseConfig,
    params: Params,
    lr_scaling: str,
    warmup_epochs: float,
    budget: Literal["epochs", "updates", "noise"],
    noise_scale: float | None = None,
) -> SweepGrid:
    """The sweep that checks a recipe: 1 tower and K towers (x N workers), S seeds, under the
    recipe's budget (`noise`: at `noise_scale`)."""
    return SweepGrid(
        towers=sorted({1, advice.towers}),
        workers=sorted({1, advice.workers}),
        aggregation=["mean"],
        lr_scaling=[lr_scaling],
        warmup_epochs=[warmup_epochs],
        seeds=list(range(advice.seeds)),
        per_tower_batch=per_tower_batch(params),
        budget=budget,
        noise_scale=noise_scale if budget == "noise" else None,
        pool=params.sweep.pool,
    )


def verification_configs(train: TrainConfig, grid: SweepGrid) -> list[TrainConfig]:
    """The grid's 1 x 1 tower runs (adascale's with no scaling: one tower measures no gain)
    and its K x N runs, not the mixed shapes its product would add."""
    one = grid.model_copy(update={"towers": [1], "workers": [1]})
    if one.lr_scaling == ["adascale"]:
        one = one.model_copy(update={"lr_scaling": ["none"], "warmup_epochs": [0.0]})
    scaled = grid.model_copy(update={"towers": [max(grid.towers)], "workers": [max(grid.workers)]})
    return expand(train, one) + expand(train, scaled)


def check_verifiable(advice: AdviseConfig, params: Params) -> None:
    """Refuse, before anything trains, settings under which some recipe could not be verified
    (a TowerbenchError naming the option)."""
    reference = reference_config(params)
    for rule in RULES:
        # Equal updates stretch the most; the noise scale's budget lies between the two.
        for budget in ("epochs", "updates"):
            grid = verification_grid(advice, params, rule, 1.0, budget)
            verification_configs(reference, grid)
