"""What `towerbench advise` keeps: the recipe as a params file to reuse (`advise-<id>.yaml`),
an MLflow run (kind `advise`) with the probe's numbers, its dataset and data version (the one a
sweep records), the advice as `advice.md`/`advice.html` and the verdict, and the same advice as
the Prefect run's markdown artifact `advice`."""

from __future__ import annotations

import dataclasses
import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from mlflow.entities import Metric, RunTag
from mlflow.exceptions import MlflowException
from prefect.artifacts import create_markdown_artifact
from prefect.context import FlowRunContext
from pydantic import BaseModel

from towerbench.config.params import Params, SweepGrid
from towerbench.config.recipe_file import Choice, recipe_file_text
from towerbench.config.sections import TrainConfig
from towerbench.core.errors import TowerbenchError
from towerbench.core.files import write_atomically
from towerbench.core.markdown import markdown_table
from towerbench.core.metrics import METRICS
from towerbench.core.tfrecord_format import dataset_dir
from towerbench.model.probe import ProbeResult
from towerbench.tasks.advise.recipe import Measurements, Recipe
from towerbench.tasks.advise.verdict import Verification
from towerbench.tasks.data.check import manifest_digest
from towerbench.tasks.data.dvc_stages import (
    FORM_DATASETS,
    PREPROCESS_STAGE,
    DataStages,
    data_version,
    run_dvc,
)
from towerbench.tasks.report.publish import report_html
from towerbench.tasks.tracking import (
    KIND_TAG,
    client_for,
    flat_params,
    log_params,
    log_sweep_inputs,
)

if TYPE_CHECKING:
    from towerbench.model.keras_recipe import KerasRecipe

SWEEP_TAG = "towerbench.advise.sweep"  # the verification sweep's parent run
VERDICT_TAG = "towerbench.advise.verdict"


@dataclass(frozen=True)
class OptimizerChoice(Choice):
    hyperparameters: dict[str, float]  # as the K-tower run uses them, after the scaling rule


@dataclass(frozen=True)
class BudgetChoice(Choice):
    noise_scale: float | None = None  # the one `budget: noise` uses


class PredictedCost(BaseModel):
    """The K-tower run's predicted optimizer steps and time (tasks/advise/recipe.py)."""

    steps: int
    reference_steps: int
    seconds: float | None
    step_seconds: float | None
    devices: int
    logical: bool
    text: str


class RecipeChoices(BaseModel):
    """The recipe as advise chose it, each choice with its reason; its predicted cost."""

    optimizer: OptimizerChoice
    lr_scaling: Choice
    warmup_epochs: Choice
    budget: BudgetChoice
    decay: Choice
    batch_norm: Choice  # its statistics: moving, ema_rule or recomputed
    prediction: PredictedCost | None = None


class Advice(BaseModel):
    """What `towerbench advise` found, as its `--json` document and the flow's result."""

    advise_run_id: str
    params_file: str
    probe: dict[str, Any]
    measurements: dict[str, Any]
    recipe: RecipeChoices
    lines: list[str]  # what the command prints
    verification: Verification | None = None

    def keras(self, train_examples: int) -> KerasRecipe:
        """The recipe as Keras objects for your own `model.fit` over `train_examples` examples
        an epoch (towerbench.keras.recipe on `params_file`)."""
        from towerbench.model.keras_recipe import recipe

        return recipe(self.params_file, train_examples)

    def summary_lines(self, with_verdict: bool = True) -> list[str]:
        """What the command and a Python call end with: the probe's and the recipe's lines,
        where the recipe and the verification's report are, and the verdict."""
        said = [*self.lines, f"Recipe: {self.params_file}"]
        if self.verification is not None:
            said.append(f"Report: {self.verification.report}")
            said += [self.verification.verdict] if with_verdict else []
        return said


def probe_document(result: ProbeResult) -> dict[str, Any]:
    return {
        **dataclasses.asdict(result),
        "largest_stable_lr": result.largest_stable_lr,
        "instability": result.instability,
    }


def recipe_document(recipe: Recipe) -> RecipeChoices:
    """Each choice with its value and reason; the optimizer's with its hyperparameters as the
    K-tower run uses them, the budget's with the noise scale it uses; and the predicted cost."""
    prediction = recipe.prediction
    optimizer, budget = recipe.optimizer, recipe.budget
    return RecipeChoices(
        optimizer=OptimizerChoice(optimizer.value, optimizer.reason, recipe.hyperparameters),
        lr_scaling=recipe.lr_scaling,
        warmup_epochs=recipe.warmup_epochs,
        budget=BudgetChoice(budget.value, budget.reason, recipe.noise_scale),
        decay=recipe.decay,
        batch_norm=recipe.batch_norm,
        prediction=None
        if prediction is None
        else PredictedCost(**dataclasses.asdict(prediction), text=prediction.text()),
    )


def recipe_params(params: Params, train: TrainConfig, grid: SweepGrid) -> dict[str, Any]:
    """`params` with the recipe's `train:` (the 1-tower run and the recipe's LR policy) and its
    verification `sweep:`; `towerbench sweep --params` on it runs the verification again."""
    recipe = params.model_copy(update={"train": train, "sweep": grid})
    sections = recipe.model_dump(mode="json", exclude_defaults=True, exclude={"nightly"})
    sections["train"] = train.model_dump(mode="json", exclude_defaults=True)
    sections["sweep"] = grid.model_dump(mode="json", exclude={"grid", "preset"}, exclude_none=True)
    return sections


def write_params_file(
    folder: Path, run_id: str, sections: dict[str, Any], lines: list[str]
) -> Path:
    """DIR/advise-<id>.yaml, whole or not at all, the recipe's reasons as its header."""
    path = Path(folder) / f"advise-{run_id[:8]}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, recipe_file_text(run_id, sections, lines).encode())
    return path


def _built_by(folder: Path, data_dir: Path, dataset: str) -> bool:
    """`folder`'s dvc.lock built `dataset`'s TFRecords under `data_dir` and they still match it
    (`dvc status` finds no changed output)."""
    lock = yaml.safe_load((folder / "dvc.lock").read_text()) or {}
    outs = lock.get("stages", {}).get(PREPROCESS_STAGE, {}).get("outs") or [{}]
    built = folder / str(outs[0].get("path", ""))
    if built.resolve() != dataset_dir(data_dir, dataset).resolve():
        return False
    project = next((p for p in (folder, *folder.parents) if (p / ".dvc").is_dir()), folder)
    target = DataStages(project, folder).target(PREPROCESS_STAGE)
    try:
        status = json.loads(run_dvc(project, "status", target, "--json").stdout or "{}")
    except (TowerbenchError, ValueError):
        return False
    changes = [change for stage in status.values() for change in stage]
    return not any(
        isinstance(c, dict) and ("changed outs" in c or "changed checksum" in c) for c in changes
    )


def advice_data_version(data_dir: Path, dataset: str) -> str:
    """The data version a sweep records for `dataset`: the DVC hash from the dvc.lock that built
    its TFRecords (the project's, or a form dataset's FORM_DATASETS/<name>/) while they match
    it, else the md5 of its manifest (tasks/data/check.py)."""
    data_dir = Path(data_dir).resolve()
    projects = dict.fromkeys([Path.cwd(), data_dir.parent])
    folders = [f for p in projects for f in (p, *sorted((p / FORM_DATASETS).glob("*")))]
    for folder in folders:
        if (folder / "dvc.lock").is_file() and _built_by(folder, data_dir, dataset):
            return data_version(folder)
    return manifest_digest(data_dir, dataset)


def start_advice_run(
    params: Params, experiment_id: str, towers: int, tags: dict[str, str], version: str
) -> str:
    """The advise run (`tags` besides its kind) in `experiment_id`, the experiment the
    verification sweep logs to, with its dataset as input and its data `version` as a sweep
    records them; its id."""
    tracking, dataset = params.tracking, params.train.dataset
    name = f"advise {dataset} {towers} towers {time.strftime('%Y-%m-%d %H:%M:%S')}"
    tags = {KIND_TAG: "advise", **tags}
    run = client_for(tracking).create_run(experiment_id, run_name=name, tags=tags)
    run_id, data_dir = run.info.run_id, Path(params.data.data_dir).resolve()
    log_params(client_for(tracking), run_id, {"data_version": version})
    log_sweep_inputs(tracking, run_id, data_dir, {dataset: version})
    return run_id


ADVICE_FILE = "advice"  # advice.md and advice.html in the advise run
VERDICT_HEADING = "## Verdict"
VERIFYING = (
    "Being verified: the verification sweep trains 1 tower and the recipe's towers now; its "
    "verdict replaces this section."
)
NOT_VERIFIED = (
    "Not verified (verification was off): `towerbench sweep --params` with the params file "
    "above verifies the recipe."
)


OPERATORS = set("/*+-=×")  # a parenthesised group next to one is part of a formula


def _top_level_groups(text: str) -> list[tuple[int, int]]:
    """(start, end) of each outermost parenthesised group of `text`."""
    groups, depth, start = [], 0, 0
    for index, character in enumerate(text):
        if character == "(":
            start = index if depth == 0 else start
            depth += 1
        elif character == ")" and depth > 0:
            depth -= 1
            if depth == 0:
                groups.append((start, index + 1))
    return groups


def without_asides(text: str) -> str:
    """`text` without its parenthesised asides (nested ones too), keeping a formula's groups
    (`(1 + B/B_noise) / (1 + b0/B_noise)`): the number, not its story."""
    kept, last = [], 0
    for start, end in _top_level_groups(text):
        before, after = text[:start].rstrip()[-1:], text[end:].lstrip()[:1]
        if before not in OPERATORS and after not in OPERATORS:
            kept.append(text[last:start])
            last = end
    kept.append(text[last:])
    return " ".join("".join(kept).split()).replace(" :", ":").replace(" ,", ",")


def _number(value: float | None, pattern: str, unit: str = "") -> str:
    return "—" if value is None else f"{format(value, pattern)}{unit}"


def measurements_table(measured: Measurements) -> str:
    """What the probe measured, each with how it was measured."""
    rows = [
        [
            "noise scale",
            _number(measured.noise_scale, ".0f"),
            without_asides(measured.noise_scale_source),
        ],
        [
            f"largest stable LR at batch {measured.global_batch}",
            _number(measured.largest_stable_lr, ".3g"),
            measured.instability or "no trial diverged",
        ],
        ["BatchNorm", "yes" if measured.has_batchnorm else "no", "in the network"],
        [
            "BatchNorm's lag",
            "—"
            if measured.accuracy_moving_bn is None or measured.accuracy_recomputed_bn is None
            else f"{100 * (measured.accuracy_recomputed_bn - measured.accuracy_moving_bn):+.1f} pp",
            "training-batch accuracy re-estimated minus with the moving statistics, after the "
            "largest stable LR trial",
        ],
        [
            "time per step at the K-tower batch",
            _number(measured.step_seconds, ".3g", " s"),
            measured.device_kind or "devices unknown",
        ],
        ["training examples", _number(measured.train_examples, ","), "an epoch"],
    ]
    return markdown_table(["measurement", "value", "how"], rows)


def _choices(recipe: Recipe) -> list[tuple[str, Any]]:
    return [
        ("optimizer", recipe.optimizer),
        ("LR scaling", recipe.lr_scaling),
        ("warmup epochs", recipe.warmup_epochs),
        ("budget", recipe.budget),
        ("schedule", recipe.decay),
        ("BatchNorm statistics", recipe.batch_norm),
    ]


def recipe_table(recipe: Recipe) -> str:
    """Each choice with its value and the number behind it (its reason without its asides,
    so the table fits a page; `recipe_reasons` gives them whole)."""
    rows = [
        [name, _value(choice), without_asides(choice.reason)] for name, choice in _choices(recipe)
    ]
    return markdown_table(["choice", "value", "the number behind it"], rows)


def _value(choice: Any) -> str:
    return f"{choice.value:g}" if isinstance(choice.value, float) else str(choice.value)


def recipe_reasons(recipe: Recipe) -> list[str]:
    """Each choice's reason in full, as list items."""
    return [
        f"- **{name}: {_value(choice)}** — {choice.reason}" for name, choice in _choices(recipe)
    ]


def verdict_section(verification: Verification | None, verifying: bool = False) -> str:
    """The verdict with its interval and the verification sweep's report; without one, whether
    the verification is under way or was off."""
    if verification is None:
        return f"{VERDICT_HEADING}\n\n{VERIFYING if verifying else NOT_VERIFIED}\n"
    metric = METRICS[verification.metric]
    low, high, difference = verification.ci_low, verification.ci_high, verification.difference
    interval = (
        "—"
        if low is None or high is None
        else f"[{metric.signed_value(low)}, {metric.signed_value(high)}]{metric.units}"
    )
    row = [
        verification.outcome,
        "—" if difference is None else metric.signed_value(difference) + metric.units,
        interval,
        _number(verification.time_ratio, ".2f", "×"),
    ]
    header = ["outcome", f"Δ {metric.label} vs 1 tower", "95% CI", "time vs 1 tower"]
    table = markdown_table(header, [row])
    return (
        f"{VERDICT_HEADING}\n\n{verification.verdict}\n\n{table}\n\nVerification sweep: "
        f"MLflow run `{verification.parent_run_id}`, report `{verification.report}`.\n"
    )


def advice_markdown(
    title: str, measured: Measurements, recipe: Recipe, params_file: Path, probe: list[str]
) -> str:
    """The advice as markdown, up to (not including) its verdict section: the probe's lines
    and measurements, the recipe table and its cost, the params file."""
    cost = [] if recipe.prediction is None else [f"Cost: {recipe.prediction.text()}.", ""]
    return "\n".join(
        [
            f"# {title}",
            "",
            "## Probe",
            "",
            *(f"- {line}" for line in probe),
            "",
            measurements_table(measured),
            "",
            "## Recipe",
            "",
            recipe_table(recipe),
            "",
            "Why, in full:",
            "",
            *recipe_reasons(recipe),
            "",
            *cost,
            f"Params file: `{params_file}` (`towerbench sweep --params {params_file}` runs the "
            "verification again).",
            "",
        ]
    )


def publish_advice(params: Params, run_id: str, text: str) -> None:
    """`text` as advice.md and advice.html in the advise run and, in a flow run, as its
    markdown artifact `advice`."""
    client = client_for(params.tracking)
    client.log_text(run_id, text, f"{ADVICE_FILE}.md")
    client.log_text(run_id, report_html(text, "towerbench advise"), f"{ADVICE_FILE}.html")
    if FlowRunContext.get() is not None:
        create_markdown_artifact(text, key="advice", description="towerbench advise: the recipe")


def _logged_advice(params: Params, run_id: str) -> str | None:
    """advice.md as the advise run holds it, or None."""
    client = client_for(params.tracking)
    with tempfile.TemporaryDirectory() as folder:
        try:
            return Path(client.download_artifacts(run_id, f"{ADVICE_FILE}.md", folder)).read_text()
        except (MlflowException, OSError):
            return None


def log_advice(
    params: Params,
    run_id: str,
    measured: Measurements,
    recipe: Recipe,
    params_file: Path,
    lines: list[str],
    verifying: bool,
) -> str:
    """The measurements as params and metrics, the params file, and the advice (`lines`: the
    probe's, then the recipe's) published (publish_advice), awaiting its verdict when
    `verifying`; its markdown."""
    client = client_for(params.tracking)
    values = dataclasses.asdict(measured)
    log_params(client, run_id, flat_params({"measured": values, **recipe.sections()}))
    numbers = {
        "noise_scale": measured.usable_noise_scale,
        "largest_stable_lr": measured.largest_stable_lr,
        "predicted_gain": recipe.predicted_gain,
        "predicted_steps": recipe.prediction.steps if recipe.prediction else None,
        "predicted_seconds": recipe.prediction.seconds if recipe.prediction else None,
    }
    now = int(time.time() * 1000)
    metrics = [Metric(key, value, now, 0) for key, value in numbers.items() if value is not None]
    client.log_batch(run_id, metrics=metrics)
    client.log_artifact(run_id, str(params_file))
    probe = lines[: len(lines) - len(recipe.lines())]
    title = f"towerbench advise: {params.train.dataset} on {measured.towers} towers"
    text = advice_markdown(title, measured, recipe, params_file, probe)
    publish_advice(params, run_id, f"{text}\n{verdict_section(None, verifying)}")
    return text


def finish_advice_run(
    params: Params, run_id: str, verification: Verification | None, status: str
) -> None:
    """The verdict (if verified) as tags and metrics and in the advice (publish_advice), then
    the run closed with `status` (FINISHED, FAILED or KILLED)."""
    client = client_for(params.tracking)
    if verification is not None:
        tags = [RunTag(SWEEP_TAG, verification.parent_run_id)]
        tags.append(RunTag(VERDICT_TAG, verification.verdict[:5000]))
        now = int(time.time() * 1000)
        numbers = {
            "difference": verification.difference,
            "ci_low": verification.ci_low,
            "ci_high": verification.ci_high,
            "difference_pp": verification.difference_pp,
            "ci_low_pp": verification.ci_low_pp,
            "ci_high_pp": verification.ci_high_pp,
            "time_ratio": verification.time_ratio,
            "reached": float(verification.reached),
            "measured_steps": verification.measured_steps,
            "measured_seconds": verification.measured_seconds,
            "seeds_needed": verification.seeds_needed,
        }
        tags.append(RunTag("towerbench.advise_outcome", verification.outcome))
        metrics = [Metric(k, v, now, 0) for k, v in numbers.items() if v is not None]
        client.log_batch(run_id, metrics=metrics, tags=tags)
        logged = _logged_advice(params, run_id)
        if logged is not None:
            kept = logged.split(f"\n{VERDICT_HEADING}\n")[0]
            publish_advice(params, run_id, f"{kept}\n{verdict_section(verification)}")
    client.set_terminated(run_id, status)
