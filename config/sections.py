"""Typed configuration: one source of truth for the CLI, Prefect form, params.yaml and MLflow.

Every section is a strict pydantic model: unknown keys and wrong types are refused with a message
that names the field. `model/` receives these objects and never reads files itself.
"""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from towerbench.config.losses import parse_loss
from towerbench.config.metrics import MetricName
from towerbench.config.model_ref import parse_model
from towerbench.config.names import DatasetName, name_from
from towerbench.config.optimizers import (
    ALL_HYPERPARAMETERS,
    DECOUPLED_WEIGHT_DECAY,
    DEFAULT_LEARNING_RATES,
    HYPERPARAMETERS,
    Hyperparameters,
    OptimizerName,
    effective_hyperparameters,
)

SourceName = Literal["digits", "cifar10", "cifar100", "imagefolder", "arrays"]


def one_value(model: type[BaseModel], name: str) -> Any:
    """The type of `model.name` with its bounds (`ge`, `le`, `pattern`...): for lists of its
    values (the sweep's) and form fields, so they refuse what the model refuses, and say so in
    their JSON schema."""
    field = model.model_fields[name]
    if not field.metadata:
        return field.annotation
    return Annotated[(field.annotation, *field.metadata)]


class StrictModel(BaseModel):
    """Refuses unknown keys and re-validates on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class FetchConfig(StrictModel):
    """Where a dataset comes from (the DVC `fetch` stage)."""

    source: SourceName = Field("digits", description="Dataset source.")
    url: str | None = Field(
        None,
        description="Mirror URL, file:// URL or local path of the archive; for imagefolder, "
        "the directory or zip laid out ROOT/SPLIT/CLASS/IMAGE; for arrays, an .npz of x_train, "
        "y_train, x_test, y_test (keras.datasets' mnist.npz layout).",
    )
    md5: str | None = Field(
        None, pattern=r"^[0-9a-fA-F]{32}$", description="Expected md5 of the archive."
    )
    name: DatasetName | None = Field(
        None,
        description="Name the dataset is stored under; None: it follows the source (the "
        "source's name, or for imagefolder and arrays the file's or folder's stem made a valid "
        "name: 'my photos (1).zip' -> my-photos-1).",
    )
    classes: list[str] | None = Field(
        None, description="imagefolder class order; default: sorted folder names."
    )
    retries: int = Field(
        3,
        ge=0,
        le=20,
        description="Download retries after a dropped connection or server error "
        "(exponential backoff; each retry resumes with an HTTP Range request).",
    )


class PreprocessConfig(StrictModel):
    """How raw data becomes TFRecords (the DVC `preprocess` stage)."""

    shards: int = Field(4, ge=1, le=1024, description="TFRecord files per split.")
    image_size: int | None = Field(
        None,
        ge=1,
        le=4096,
        description="imagefolder: resize every image to this square side; default: the most "
        "common height x width in the folder.",
    )
    label_set: Literal["fine", "coarse"] = Field(
        "fine", description="cifar100: label the 100 fine classes or the 20 coarse superclasses."
    )


# Settings that suit a model or a dataset better than the tutorial's defaults. They replace a
# default only: a value the user gives explicitly always wins (dataset presets over model presets).
MODEL_PRESETS: dict[str, dict[str, object]] = {
    # He et al. 2016: momentum 0.9, weight decay 1e-4 (= 1e-4 * l2_loss), full 32x32 images
    # with flips; the tutorial's brightness/contrast distortions are not part of it.
    "resnet20": {
        "optimizer": "momentum",
        "weight_decay": 1e-4,
        "crop_size": None,
        "brightness_delta": 0.0,
        "contrast_lower": 1.0,
        "contrast_upper": 1.0,
    },
}
DATASET_PRESETS: dict[str, dict[str, object]] = {
    # 8x8 grey digits: no crop, no flips (a mirrored 2 is not a 2), no brightness/contrast jitter;
    # momentum reaches ~97-98% test accuracy in 12-15 epochs (plain SGD at 0.1 needs about 30).
    # The LR decays linearly to 0: at a constant 0.05 the last epoch's accuracy hung on float
    # rounding (1 x 2 and 1 x 4 towers, equal but for the order of additions, ended at 84.1% and
    # 90.0%, seed 2); annealed they end within one test example of each other.
    "digits": {
        "crop_size": None,
        "random_flip": False,
        "brightness_delta": 0.0,
        "contrast_lower": 1.0,
        "contrast_upper": 1.0,
        "optimizer": "momentum",
        "base_lr": 0.05,
        "decay": "linear",
        "epochs": 15,
    },
}


def _option(field: str) -> str:
    return "--" + field.replace("_", "-")


def options_read_by(optimizer: str) -> str:
    """`--beta-1, --beta-2, --epsilon`: the hyperparameter options `optimizer` reads."""
    return ", ".join(_option(name) for name in sorted(HYPERPARAMETERS[optimizer])) or "none of them"


DEFAULT_LOSS = "sparse_categorical_crossentropy"


class TrainConfig(StrictModel):
    """One training run: model, towers, gradient aggregation, learning-rate policy, data.

    Presets (MODEL_PRESETS, DATASET_PRESETS) fill the fields the user did not give.
    """

    dataset: DatasetName = Field("digits", description="Preprocessed dataset name.")
    model: str = Field(
        "tutorial",
        description="Network: tutorial (the tutorial's CNN, LRN), tutorial_bn (the same with "
        "BatchNorm in place of each LRN, statistics per tower), resnet20, or your own: "
        "path/to/file.py:function (relative to the params file's folder) or "
        "package.module:function, called as function(input_shape, num_classes) and returning "
        "an uncompiled Keras model whose output is logits (its layers' regularizers are its "
        "weight decay; setting weight_decay beside one is refused).",
    )
    towers: int = Field(1, ge=1, le=1024, description="Towers per worker, one per device.")
    workers: int = Field(
        1,
        ge=1,
        le=1024,
        description="Worker processes training together (one per host, or several on this "
        "machine); each runs `towers` towers on its slice of every global batch.",
    )
    collective_timeout: float = Field(
        300,
        gt=0,
        description="Workers > 1: seconds a cross-worker all-reduce may wait for a stuck worker "
        "before the run fails (a dead worker is noticed within about 10 s).",
    )
    device_type: Literal["auto", "gpu", "cpu"] = Field(
        "auto", description="Tower devices: GPUs if present (auto), or force GPU / CPU."
    )
    parameter_device: Literal["cpu", "gpu0"] = Field(
        "cpu", description="Where variables live: the CPU (as in the tutorial) or the first GPU."
    )
    aggregation: Literal["mean", "sum"] = Field(
        "mean",
        description="Combine tower gradients by their mean (Horovod, the tutorial) or sum "
        "(tf.distribute without global-batch loss scaling).",
    )
    loss: str = Field(
        DEFAULT_LOSS,
        description="Per-example loss, averaged over the batch: sparse_categorical_crossentropy "
        "(class ids), categorical_crossentropy (one-hot or soft label rows), binary_crossentropy "
        "(0/1 label rows: binary or multi-label), all three from logits; mse, mae, huber "
        "(regression targets); or your own, path/to/file.py:function (relative to the params "
        "file's folder) or package.module:function, called as function(y_true, y_pred) on the "
        "labels the dataset holds and returning one loss per example (batch,), as Keras' "
        "losses do. in_batch_softmax (retrieval; class ids: each example's candidate id): your "
        "model returns (batch, 2, d), a query's embedding and its candidate's, and each query's "
        "softmax is over its batch's candidates (q·cᵀ / temperature, other examples of the same "
        "candidate masked); a tower's batch is its own B/k.",
    )
    metric: MetricName = Field(
        "auto",
        description="What judges a run (test split), its verdicts, advise and the report: "
        "accuracy, binary_accuracy, auc, recall_at_K (higher is better), mae, rmse (lower is "
        "better); auto: "
        "the loss's own (accuracy for the categorical cross-entropies, binary_accuracy for "
        "binary_crossentropy, mae for mse, mae, huber, recall_at_10 for in_batch_softmax); "
        "recall_at_K (K 1, 5, 10, 50, 100): the share of test queries whose own candidate ranks "
        "among the K best of eval_candidates test candidates.",
    )
    temperature: float = Field(
        1.0,
        gt=0,
        description="in_batch_softmax: the logits are q·cᵀ divided by this (1: TFRS' default).",
    )
    cross_tower: Literal["local", "gather"] = Field(
        "local",
        description="in_batch_softmax: local (each tower's queries against its own B/k "
        "candidates, what averaging towers computes) or gather (every tower's candidates, "
        "gathered across the towers and workers, gradients through each tower's own: k towers "
        "then compute one device's big-batch loss and gradient, for a network without "
        "BatchNorm; not with xla or adascale).",
    )
    eval_candidates: int = Field(
        1000,
        ge=2,
        description="in_batch_softmax: the distinct test candidates every test query is ranked "
        "against for recall@K and the test loss, on one device whatever the towers (the first of "
        "each id in the test split).",
    )
    global_batch: int = Field(128, ge=1, description="Examples per step over all towers.")
    epochs: float = Field(10, gt=0, description="Passes over the training set.")
    optimizer: OptimizerName = Field(
        "sgd",
        description="SGD family: sgd, momentum (heavy ball), nesterov, lars (layer-wise trust "
        "ratio, You et al. 2017); adaptive: adam, adamw (decoupled weight decay), rmsprop, lamb "
        "(Adam with LARS' trust ratio, You et al. 2019). Adaptive optimizers default to "
        "base_lr 0.001.",
    )
    momentum: float = Field(0.9, ge=0, lt=1, description="Momentum of momentum, nesterov, lars.")
    beta_1: float = Field(
        0.9, ge=0, lt=1, description="adam, adamw, lamb: decay of the gradient's moving average."
    )
    beta_2: float = Field(
        0.999,
        ge=0,
        lt=1,
        description="adam, adamw, lamb: decay of the squared gradient's moving average.",
    )
    rho: float = Field(
        0.9, ge=0, lt=1, description="rmsprop: decay of the squared gradient's moving average."
    )
    epsilon: float = Field(
        1e-7,
        gt=0,
        le=1,
        description="adam, adamw, rmsprop, lamb: added to the denominator; lars: to the trust "
        "ratio's denominator.",
    )
    trust_coefficient: float = Field(
        0.001, gt=0, le=1, description="lars: eta, the trust ratio's coefficient (You et al.)."
    )
    base_lr: float = Field(0.1, gt=0, description="Learning rate at the reference batch size.")
    reference_batch: int = Field(128, ge=1, description="Batch size base_lr was tuned for.")
    lr_scaling: Literal["none", "linear", "sqrt", "adascale"] = Field(
        "none",
        description="Scale base_lr by (global_batch / reference_batch)^{0, 1, 1/2}, or by "
        "AdaScale's gain measured each step (the schedule then runs at its progress tau, and the "
        "run ends when tau reaches the reference batch's number of updates).",
    )
    warmup_epochs: float = Field(
        0, ge=0, description="Gradual linear warmup from base_lr to the scaled LR (Goyal 2017)."
    )
    decay: Literal["constant", "staircase", "piecewise", "cosine", "linear"] = Field(
        "staircase",
        description="LR decay, counted in epochs; cosine and linear reach 0 at the run's last "
        "epoch (linear after warmup: the one-cycle shape).",
    )
    decay_epochs: float = Field(
        350, gt=0, description="staircase: multiply the LR by decay_factor every this many epochs."
    )
    decay_factor: float = Field(0.1, gt=0, le=1, description="Factor per staircase/piecewise step.")
    decay_boundaries: list[float] = Field(
        default_factory=list, description="piecewise: epochs at which the LR is multiplied."
    )
    weight_decay: float = Field(
        0.004,
        ge=0,
        description="sgd, momentum, nesterov, adam, rmsprop: L2 coefficient on tf.nn.l2_loss "
        "(sum(w**2)/2) in the loss, once per step; adamw, lamb, lars: the optimizer's own "
        "decoupled weight decay (no L2 term in the loss).",
    )
    ema_decay: float = Field(
        0.9999, ge=0, lt=1, description="Exponential moving average of the weights."
    )
    ema_scaling: Literal["none", "ema_rule"] = Field(
        "none",
        description="ema_rule: BatchNorm's momentum and the weight EMA's decay rho become "
        "rho**k, k = global batch / reference batch (Busbridge et al. 2023), so they span the "
        "same examples at any batch; none: as given.",
    )
    eval_bn: Literal["moving", "recomputed"] = Field(
        "moving",
        description="The BatchNorm statistics test_accuracy (and so the verdicts) uses: the "
        "moving ones (Keras'), or re-estimated at the evaluated weights on training batches; "
        "both are recorded either way.",
    )
    crop_size: int | None = Field(
        24, ge=1, description="Random crop (train) / central crop (eval) side; none = full image."
    )
    random_flip: bool = Field(True, description="Random left-right flip.")
    brightness_delta: float = Field(63, ge=0, description="Random brightness, 0-255 scale.")
    contrast_lower: float = Field(0.2, ge=0, description="Random contrast lower factor.")
    contrast_upper: float = Field(1.8, ge=0, description="Random contrast upper factor.")
    seed: int = Field(0, ge=0, description="Seed for weights, data order and distortions.")
    xla: bool = Field(False, description="Compile the training step with XLA.")
    precision: Literal["float32", "mixed_float16", "mixed_bfloat16"] = Field(
        "float32",
        description="Layers compute in float32, or in float16/bfloat16 with float32 master "
        "weights (float16 with a dynamic loss scale); the real gains are on GPUs.",
    )
    checkpoint_every: int = Field(
        0,
        ge=0,
        description="With a checkpoint folder: also save every N steps (0: at each epoch's "
        "end only).",
    )
    eval_every_epochs: float = Field(1, gt=0, description="Evaluate on the test split this often.")
    divergence_factor: float = Field(
        3.0,
        gt=1,
        description="Stop early when a step's cross-entropy is NaN or above this many times "
        "chance level (ln of the number of classes).",
    )

    @field_validator("model")
    @classmethod
    def _model_reference(cls, model: str) -> str:
        parse_model(model)
        return model

    @field_validator("loss")
    @classmethod
    def _loss_reference(cls, loss: str) -> str:
        parse_loss(loss)
        return loss

    @field_validator("global_batch")
    @classmethod
    def _batch_divides_over_towers(cls, global_batch: int, info: ValidationInfo) -> int:
        towers, workers = info.data.get("towers"), info.data.get("workers")
        if towers is None or workers is None:
            return global_batch
        replicas = towers * workers
        if global_batch % replicas:
            over = (
                f"--towers {towers}" if workers == 1 else f"--workers {workers} x --towers {towers}"
            )
            raise ValueError(
                f"{global_batch} is not divisible by {over}; each tower needs the "
                f"same share (try {max(global_batch // replicas, 1) * replicas})"
            )
        return global_batch

    @model_validator(mode="after")
    def _apply_presets_and_check(self) -> TrainConfig:
        for name, value in self.preset_fields().items():
            self.__dict__[name] = value  # a constant of ours: no re-validation needed
        self._check_hyperparameters_apply()
        if self.contrast_upper < self.contrast_lower:
            raise ValueError(
                f"--contrast-upper {self.contrast_upper} is below --contrast-lower "
                f"{self.contrast_lower}"
            )
        if (
            self.lr_scaling == "adascale"
            and self.replicas == 1
            and self.global_batch != self.reference_batch
        ):
            raise ValueError(
                f"--lr-scaling adascale measures the gradient variance across towers: with one "
                f"tower, --global-batch ({self.global_batch}) must equal --reference-batch "
                f"({self.reference_batch})"
            )
        if self.decay == "piecewise" and not self.decay_boundaries:
            raise ValueError("--decay piecewise needs --decay-boundaries (epochs, comma-separated)")
        return self

    def _check_hyperparameters_apply(self) -> None:
        """A hyperparameter the optimizer does not read, given another value than its default,
        is a mistake (a whole configuration copied field by field gives each its default)."""
        takes = HYPERPARAMETERS[self.optimizer]
        given = sorted(
            name
            for name in ALL_HYPERPARAMETERS & self.model_fields_set - takes
            if getattr(self, name) != type(self).model_fields[name].default
        )
        if given:
            raise ValueError(
                f"{_option(given[0])} does not apply to --optimizer {self.optimizer} "
                f"(it takes: {options_read_by(self.optimizer)})"
            )

    def optimizer_hyperparameters(self) -> Hyperparameters:
        """The optimizer's hyperparameters as this run uses them (after its scaling rule)."""
        return effective_hyperparameters(
            self.optimizer,
            self.model_dump(),
            self.lr_scaling,
            self.global_batch / self.reference_batch,
            self.weight_decay,
        )

    @property
    def ema_scale(self) -> float:
        """k of the EMA rule: global batch / reference batch (1 unless ema_scaling is ema_rule)."""
        return self.global_batch / self.reference_batch if self.ema_scaling == "ema_rule" else 1.0

    def scaled_momentum(self, momentum: float) -> float:
        """A per-step momentum (BatchNorm's, the weight EMA's decay) as this run uses it."""
        return momentum**self.ema_scale

    @property
    def l2_weight_decay(self) -> float:
        """The L2 coefficient the loss carries: none when the optimizer decays the weights
        itself (adamw, lamb, lars)."""
        return 0.0 if self.optimizer in DECOUPLED_WEIGHT_DECAY else self.weight_decay

    @property
    def replicas(self) -> int:
        """Towers over all workers: the number of shards each global batch is split into."""
        return self.towers * self.workers

    @classmethod
    def from_stored(cls, text: str) -> TrainConfig:
        """A configuration saved as JSON by this or an earlier version (keys since removed are
        dropped, keys since added take their defaults)."""
        values = json.loads(text)
        return cls.model_validate({key: values[key] for key in cls.model_fields if key in values})

    def preset_fields(self) -> dict[str, object]:
        """Fields whose value came from a preset (not the user, not the plain default). A
        preset's base_lr goes with its optimizer: another optimizer takes its own default LR."""
        preset = {**MODEL_PRESETS.get(self.model, {}), **DATASET_PRESETS.get(self.dataset, {})}
        chosen = "optimizer" in self.model_fields_set
        optimizer = self.optimizer if chosen else preset.get("optimizer", self.optimizer)
        if preset.get("optimizer", optimizer) != optimizer:
            preset.pop("base_lr", None)
        if optimizer in DEFAULT_LEARNING_RATES:
            preset.setdefault("base_lr", DEFAULT_LEARNING_RATES[optimizer])
        return {name: value for name, value in preset.items() if name not in self.model_fields_set}


class DataConfig(StrictModel):
    """Where data lives on disk."""

    data_dir: Path = Field(Path("data"), description="Root of raw archives and TFRecords.")


def dataset_name(config: FetchConfig) -> str:
    """Where `config`'s data is stored: its name, the imagefolder's or .npz's stem made a valid
    name, or the source name."""
    if config.name is not None:
        return config.name
    if config.source in ("imagefolder", "arrays") and config.url:
        return name_from(PurePosixPath(config.url.rstrip("/")).stem)
    return config.source
