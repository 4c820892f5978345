"""Evaluation artifacts of one configuration run, logged into its (active) MLflow run.

Runs inside the training process, where the trained model lives: the learning curves, the
confusion matrix, the model and the gradient check are logged. That the logged model loads and
reproduces the logged test accuracy is checked by tests/test_flows_sweep.py, not in every run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display: figures only go to files

import matplotlib.pyplot as plt  # noqa: E402
import mlflow  # noqa: E402
import numpy as np  # noqa: E402

from towerbench.core.metrics import METRICS  # noqa: E402
from towerbench.core.outcome import Status  # noqa: E402
from towerbench.model.records import EpochRecord  # noqa: E402
from towerbench.tasks.tracking import dataset_input  # noqa: E402

MODEL_NAME = "model"


def log_data_input(data_dir: Path, dataset: str, data_version: str) -> None:
    """Record the dataset, its DVC content hash as the digest, in the active run."""
    mlflow.log_input(dataset_input(data_dir, dataset, data_version), context="training")


def learning_curves_figure(history: list[EpochRecord], metric: str = "accuracy") -> plt.Figure:
    """The test metric (train.metric as resolved; with accuracy the training accuracy too) and
    the loss per epoch."""
    epochs = [record.epoch for record in history]
    figure, (metric_axis, loss_axis) = plt.subplots(1, 2, figsize=(10, 4))
    keys = ("train_accuracy",) if metric == "accuracy" else ()
    for key in (*keys, "test_metric", "ema_test_metric"):
        metric_axis.plot(epochs, [getattr(record, key) for record in history], label=key)
    for key in ("cross_entropy", "weight_decay_loss", "total_loss"):
        loss_axis.plot(epochs, [getattr(record, key) for record in history], label=key)
    label = METRICS[metric].label
    metric_axis.set(xlabel="epoch", ylabel=label, title=f"Test {label}")
    loss_axis.set(xlabel="epoch", ylabel="loss", title="Loss (mean over all towers)")
    metric_axis.legend()
    loss_axis.legend()
    figure.tight_layout()
    return figure


def confusion_matrix_figure(matrix: np.ndarray, classes: list[str]) -> plt.Figure:
    size = max(4.0, 0.5 * len(classes))
    figure, axis = plt.subplots(figsize=(size, size))
    axis.imshow(matrix, cmap="Blues")
    axis.set_xticks(range(len(classes)), classes, rotation=90)
    axis.set_yticks(range(len(classes)), classes)
    axis.set(xlabel="predicted", ylabel="true", title="Confusion matrix (test split)")
    figure.tight_layout()
    return figure


def log_model(model: Any) -> str:
    """Log the Keras model (a `.keras` file under Logged Models); returns its model URI."""
    import tensorflow as tf

    info = mlflow.keras.log_model(
        model,
        name=MODEL_NAME,
        # Spelled out: inferring requirements would load the model once more in a subprocess.
        pip_requirements=[f"tensorflow=={tf.__version__}"],
    )
    return info.model_uri


def log_evaluation(result: Any) -> None:
    """Log curves, and unless the run diverged (no meaningful model), the confusion matrix (by
    accuracy), the model and the gradcheck."""
    from towerbench.model.gradcheck import run_gradcheck

    config = result.config
    figure = learning_curves_figure(result.history, result.final.metric)
    mlflow.log_figure(figure, "learning_curves.png")
    plt.close("all")
    if result.status != Status.COMPLETED:
        return

    if result.confusion_matrix is not None:  # judged by accuracy
        matrix = np.asarray(result.confusion_matrix)
        mlflow.log_dict(
            {"classes": list(result.classes), "matrix": matrix.tolist()}, "confusion_matrix.json"
        )
        figure = confusion_matrix_figure(matrix, list(result.classes))
        mlflow.log_figure(figure, "confusion_matrix.png")
        plt.close("all")

    mlflow.set_tag("towerbench.model_uri", log_model(result.model))

    if config.towers >= 2:
        # On one fixed synthetic batch of the same network, towers and global batch, shaped as
        # the trained model's input.
        spec = result.model.inputs[0]
        check = run_gradcheck(
            config.model,
            config.towers,
            config.global_batch,
            config.seed,
            None,
            config.precision,
            input_shape=tuple(spec.shape[1:]),
            num_classes=len(result.classes),
            integer_inputs="int" in str(spec.dtype),
            loss=config.loss,
            labels=result.labels,
            temperature=config.temperature,
            cross_tower=config.cross_tower,
        )
        if check is not None:  # None on a worker other than the chief
            mlflow.log_dict(check.to_json(), "gradcheck.json")
